"""The dashboard's endpoints of durable workflows' runs (SPEC §14): the runs with their
status, a run with its steps (each with its times, for a timeline); with ``--write``,
cancelling a run."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reactor._base.results import RunInfo
from reactor._handles.workflows import STATUSES

from .requests import Problem, body_of, clipped, param, shortened, state_of

__all__ = ["ROUTES", "RUNS_MAX"]

RUNS_MAX: Final = 200  # runs listed, at most: those changed last (``count`` counts all)
TEXT_MAX: Final = 2000  # characters of an input, result or error sent, at most


async def _run_list(request: Request) -> Response:
    """``GET /api/runs?workflow=GLOB&status=S``: the runs changed last (up to
    ``RUNS_MAX``), newest first, each without its steps; how many match, how many of
    them failed."""
    status = request.query_params.get("status") or None
    if status is not None and status not in STATUSES:
        raise Problem(400, "InvalidRequest", f"status is one of {', '.join(STATUSES)}")
    found = await state_of(request).runs(param(request, "workflow", "*"), status)
    found.sort(key=lambda info: info.updated, reverse=True)
    return JSONResponse(
        {
            "runs": [_summary(info) for info in found[:RUNS_MAX]],
            "count": len(found),
            "failed": sum(info.status == "failed" for info in found),
        }
    )


async def _run(request: Request) -> Response:
    """``GET /api/run?id=ID``: ``State.run_info`` (404 if no such run), its values as
    JSON text cut short past ``TEXT_MAX`` characters."""
    run_id = param(request, "id")
    try:
        info = await state_of(request).run_info(run_id)
    except KeyError:
        raise Problem(404, "NotFound", f"no run {clipped(run_id)!r}") from None
    return JSONResponse(
        {
            **_summary(info),
            "steps": [
                {
                    "name": step.name,
                    "status": step.status,
                    "result": _text(step.result),
                    "error": step.error,
                    "started": step.started,
                    "ended": step.ended,
                }
                for step in info.steps
            ],
        }
    )


async def _cancel_run(request: Request) -> Response:
    """``POST /api/cancel_run {"id"}``: ``State.cancel``; 404 if no such run."""
    data = await body_of(request, ("id",), ())
    try:
        cancelled = await state_of(request).cancel(data["id"])
    except KeyError:
        raise Problem(404, "NotFound", f"no run {clipped(str(data['id']))!r}") from None
    return JSONResponse({"cancelled": cancelled})


def _summary(info: RunInfo) -> dict[str, Any]:
    error = info.error
    return {
        "id": info.id,
        "workflow": info.workflow,
        "status": info.status,
        "attempts": info.attempts,
        "steps": len(info.steps),
        "input": _text(info.input),
        "result": _text(info.result),
        "error": None if error is None else {k: shortened(v, TEXT_MAX) for k, v in error.items()},
        "created": info.created,
        "updated": info.updated,
    }


def _text(value: Any) -> str | None:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return shortened(text, TEXT_MAX)


# (path, endpoint, whether it writes): the writes go behind the app's guard.
ROUTES: Final = (
    ("/api/runs", _run_list, False),
    ("/api/run", _run, False),
    ("/api/cancel_run", _cancel_run, True),
)
