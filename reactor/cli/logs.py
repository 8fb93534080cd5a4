"""What the command line shows of reactor's log: warnings and errors on stderr, one bare
line each, for every command; ``reactor serve`` shows more, each line stamped."""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["SERVICE_FORMAT", "show_service_log", "show_warnings"]

# One line per event, as journald and container logs keep them: when, how bad, who.
SERVICE_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_handler: Final = logging.StreamHandler()  # stderr, formatted as logging's last resort does


def show_warnings() -> None:
    """Print reactor's warnings and errors on stderr, as bare lines: the library only
    adds a NullHandler, and a command line is an application that shows them."""
    _handler.setLevel(logging.WARNING)
    logging.getLogger("reactor").addHandler(_handler)


def show_service_log(level: int) -> None:
    """Print reactor's messages from ``level`` on, each with its time, level and logger
    (a long-running service's log)."""
    _handler.setLevel(level)
    _handler.setFormatter(logging.Formatter(SERVICE_FORMAT))
    root = logging.getLogger("reactor")
    root.setLevel(min(level, root.getEffectiveLevel()))
    if _handler not in root.handlers:
        root.addHandler(_handler)
