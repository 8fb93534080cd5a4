"""Who may reach the dashboard, and who may write through it.

Reads are open to whatever can connect; the server binds a loopback address unless told
otherwise. The ``Host`` header must name the server by a name it answers to (Starlette's
``TrustedHostMiddleware``), which defeats DNS rebinding: a page on another site whose
name was re-pointed at 127.0.0.1 sends its own name as the host, and is refused.

A write is refused unless the server was started with ``--write``, and unless the
request carries ``Content-Type: application/json`` and ``X-Reactor-UI: 1``. A page on
another site cannot send either without a CORS preflight, which this server never
grants, and a plain HTML form can send neither: a cross-site request cannot write.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Final

from starlette.requests import Request

__all__ = ["HEADER", "LOOPBACK_NAMES", "allowed_hosts", "is_loopback", "write_refusal"]

HEADER: Final = "X-Reactor-UI"
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
_WILDCARDS: Final = ("", "0.0.0.0", "::")  # noqa: S104 - names, not a bind


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is reachable from this machine only."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The names the ``Host`` header may carry for a server bound to ``bind``: the
    loopback names, the bound address, and this machine's names when it listens beyond
    loopback; ``extra`` adds more (``*`` admits any)."""
    names = list(LOOPBACK_NAMES)
    if bind not in _WILDCARDS:
        names.append(bind if ":" not in bind else f"[{bind.strip('[]')}]")
    if not is_loopback(bind):
        names.append(socket.gethostname())  # not getfqdn(): it may wait on DNS
    names += list(extra)
    return list(dict.fromkeys(names))


def write_refusal(request: Request, writable: bool) -> str | None:
    """Why this write request is refused, or None if it may go ahead."""
    if not writable:
        return "the dashboard is read-only: start it with 'reactor ui --write' to change values"
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        return "a write must be sent as Content-Type: application/json"
    if request.headers.get(HEADER) != "1":
        return f"a write must carry the header {HEADER}: 1 (sent by the dashboard's page)"
    origin = request.headers.get("origin")
    if origin is not None and origin.partition("://")[2] != request.headers.get("host"):
        return f"a write from another origin ({origin}) is refused"
    return None
