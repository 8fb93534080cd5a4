"""The dashboard's endpoint of derived values (SPEC §15): those live in the engine the
dashboard shares (one per database and process: a dashboard mounted in the program that
made them, or run beside them in its process), with their value, revision, runs and
last error. A dashboard of a process of its own (``reactor ui``) has none: it lists what
a value writes with ``into=`` as keys."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .requests import shortened, state_of

__all__ = ["ROUTES"]

TEXT_MAX: Final = 2000  # characters of a value or an error sent, at most


async def _derived(request: Request) -> Response:
    """``GET /api/derived``: the live derived values, by name."""
    found = await state_of(request).derived()
    return JSONResponse({"derived": [_summary(value) for value in found]})


def _summary(value: Any) -> dict[str, Any]:
    error = value.error
    return {
        "name": value.name,
        "value": shortened(json.dumps(value.value, ensure_ascii=False), TEXT_MAX),
        "revision": value.revision,
        "recomputations": value.recomputations,
        "error": None if error is None else shortened(f"{type(error).__name__}: {error}", TEXT_MAX),
    }


# (path, endpoint, whether it writes), as run_routes.ROUTES.
ROUTES: Final = (("/api/derived", _derived, False),)
