"""What a job keeps of its attempts: who took it (host, pid, thread) and, for each
attempt that failed, why (a ``nack``'s error, or its lease running out), so that a
dead letter says what went wrong and where."""

from __future__ import annotations

import functools
import os
import socket
import threading
import traceback
from typing import Any, Final

import orjson

from reactor.errors import InvalidArgumentError

__all__ = [
    "LEASE_RAN_OUT",
    "MAX_ERRORS",
    "MAX_ERROR_CHARS",
    "add_error",
    "error_text",
    "errors_of",
    "last_error",
    "worker",
]

MAX_ERRORS: Final = 50  # a job keeps the errors of its last 50 failed attempts
MAX_ERROR_CHARS: Final = 8000  # of an error's text: its end (a traceback's last frames)
LEASE_RAN_OUT: Final = "the lease ran out (the worker did not ack, nack or extend in time)"


@functools.cache
def _host() -> str:
    return socket.gethostname()


def worker() -> str:
    """The calling thread as a job's taker: JSON text of its host, pid and thread."""
    thread = threading.current_thread()
    return orjson.dumps(
        {"host": _host(), "pid": os.getpid(), "thread": thread.name, "thread_id": thread.ident}
    ).decode()


def error_text(error: object) -> str:
    """An error as a job keeps it: a string as it is, an exception as its traceback
    (its type and message when it has none); the last ``MAX_ERROR_CHARS`` characters.

    Raises:
        InvalidArgumentError: neither a string nor an exception.
    """
    if isinstance(error, BaseException):
        text = "".join(traceback.format_exception(error)).rstrip("\n")
    elif isinstance(error, str):
        text = error
    else:
        raise InvalidArgumentError(f"error must be a string or an exception, not {error!r}")
    return text if len(text) <= MAX_ERROR_CHARS else "…" + text[-MAX_ERROR_CHARS + 1 :]


def add_error(
    errors: str | None, attempt: int, at: float, text: str | None, taker: str | None
) -> str:
    """``errors`` (JSON text of a list; None: none yet) with the failure of ``attempt``
    at ``at`` added: its ``text`` (None: no reason given) and its ``taker``
    (``worker()``'s text; None: not known). The last ``MAX_ERRORS`` are kept."""
    found: list[Any] = [] if errors is None else orjson.loads(errors)
    entry: dict[str, Any] = {"attempt": attempt, "at": at, "error": text}
    if taker is not None:
        entry["worker"] = orjson.loads(taker)
    found.append(entry)
    return orjson.dumps(found[-MAX_ERRORS:]).decode()


def errors_of(errors: str | None) -> list[dict[str, Any]]:
    """The errors of a job's attempts, oldest first: dicts of ``attempt``, ``at``
    (epoch seconds), ``error`` and ``worker`` (``host``, ``pid``, ``thread``)."""
    return [] if errors is None else list(orjson.loads(errors))


def last_error(errors: str | None) -> str | None:
    """The text of the last error of ``errors`` (None: none, or none given)."""
    found = errors_of(errors)
    return found[-1]["error"] if found else None
