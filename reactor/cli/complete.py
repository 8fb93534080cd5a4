"""Shell completion of scope names and keys (click's ``shell_complete=`` of the SCOPE
and KEY arguments), read from the database ``--db`` or ``$REACTOR_DB`` names.

Completion runs at each Tab: it opens the database read-only, reads names beginning
with what is typed (at most ``MOST`` of them), and never fails loudly: a database that
does not exist, cannot be opened or read completes nothing, and creates nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

from .options import DB

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from reactor._handles.state import State

__all__ = ["MOST", "complete_key", "complete_scope"]

MOST: Final = 200  # names offered at most: a shell shows no more usefully


def _escaped(text: str) -> str:
    """``text`` as a glob that matches only itself."""
    return "".join(f"\\{char}" if char in "*?[\\" else char for char in text)


def _read(ctx: click.Context, read: Callable[[State], list[str]]) -> list[str]:
    """``read(state)`` on the database the command line names; [] if it cannot."""
    from reactor import open as open_state
    from reactor._storage.locate import locate

    try:
        target = ctx.meta.get(DB)
        _, location = locate(target, "normal")
        if location is None or (isinstance(location, Path) and not location.exists()):
            return []  # in memory (nothing to read), or no such file: create none
        with open_state(target, readonly=True) as state:
            return read(state)[:MOST]
    except Exception:  # noqa: BLE001 - a Tab must never print a traceback into the shell
        return []


def complete_scope(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The scopes whose names begin with ``incomplete``."""
    from click.shell_completion import CompletionItem

    names = _read(ctx, lambda state: [n for n in state.scopes() if n.startswith(incomplete)])
    return [CompletionItem(name) for name in names]


def complete_key(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The keys of the command's SCOPE that begin with ``incomplete``."""
    from click.shell_completion import CompletionItem

    scope = ctx.params.get("scope")
    if not isinstance(scope, str) or not scope:
        return []
    names = _read(ctx, lambda state: state.scope(scope).keys(_escaped(incomplete) + "*"))
    return [CompletionItem(name) for name in names]
