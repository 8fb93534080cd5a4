"""What the dashboard's endpoints share: the refusal of a request (``Problem``) and how
refusals and reactor's errors are answered, the app's handle, a request's parameters and
body, reads of the store for what no public verb reads, and text cut short."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reactor._backup.exchange import parse_json
from reactor._storage.store import StoreReads
from reactor.aio import AsyncState
from reactor.aio.state import link_of
from reactor.errors import ConflictError, RevisionCompactedError

__all__ = [
    "TEXT_MAX",
    "Problem",
    "body_of",
    "clipped",
    "param",
    "problem_answer",
    "reactor_error_answer",
    "shortened",
    "state_of",
    "store_read",
]

TEXT_MAX: Final = 200  # characters of a stored JSON text sent, at most, by default
T = TypeVar("T")


class Problem(Exception):
    """A request the API refuses: answered as ``{"error", "message"}`` with ``status``."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error


def state_of(request: Request) -> AsyncState:
    """The app's handle on the database."""
    state: AsyncState = request.app.state.reactor
    return state


def _answer(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


async def problem_answer(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return _answer(exc.status, exc.error, str(exc))


async def reactor_error_answer(_request: Request, exc: Exception) -> Response:
    if isinstance(exc, ValueError | TypeError):
        status = 400  # bad input: InvalidKeyError, InvalidValueError, InvalidOpError, ...
    elif isinstance(exc, RevisionCompactedError):
        status = 410
    elif isinstance(exc, ConflictError):
        status = 409
    elif isinstance(exc, TimeoutError):
        status = 503  # BusyError, OperationTimeout: worth another try
    else:
        status = 500
    return _answer(status, type(exc).__name__, str(exc))


def param(request: Request, name: str, default: str | None = None) -> str:
    value = request.query_params.get(name, default)
    if value is None:
        raise Problem(400, "InvalidRequest", f"the query parameter {name!r} is required")
    return value


async def body_of(request: Request, required: tuple[str, ...], optional: tuple[str, ...]) -> Any:
    """The request's JSON object, with the fields ``required`` and no others but
    ``optional``."""
    try:
        data = parse_json(await request.body())
    except ValueError as exc:
        raise Problem(400, "InvalidRequest", f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Problem(400, "InvalidRequest", "the request body must be a JSON object")
    missing = [name for name in required if name not in data]
    if missing:
        raise Problem(400, "InvalidRequest", f"the request needs {', '.join(map(repr, missing))}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise Problem(400, "InvalidRequest", f"unknown fields: {', '.join(map(repr, unknown))}")
    return data


async def store_read(request: Request, read: Callable[[StoreReads, float], T]) -> T:
    """``read(store, now)``, for what no public verb reads, in a worker thread of the
    app's handle."""
    handle = state_of(request)
    link = link_of(handle)
    engine = await link.engine()
    return await link.run(read, engine.store, engine.now())


def shortened(text: str | None, most: int = TEXT_MAX) -> str | None:
    """``text``, or its start ending in "…" (which JSON text never ends in) if longer
    than ``most`` characters."""
    if text is None or len(text) <= most:
        return text
    return text[: most - 1] + "…"


def clipped(text: str) -> str:
    return text if len(text) <= 64 else text[:63] + "…"
