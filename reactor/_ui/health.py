"""The health of a ``reactor serve`` process, over HTTP (``--health PORT``).

```text
GET /livez    200 {"status": "ok"}, or 503 {"status": "failing", "problems": [...]}:
              this process's upkeep is stuck (its thread died, or its last round ended
              longer than the allowed lag ago). A supervisor restarts the process.
GET /healthz  the same, and 503 when the database cannot be read or its oldest due work
              (a key past its deadline, a due timer, a lease run out) has waited longer
              than the allowed lag, whoever should do it: {"status", "problems",
              "database", "pid", "upkeep": stats()["upkeep"]}.
```

Liveness looks at this process only, so that a slow database does not get every
server restarted; readiness and monitoring look at the database's upkeep as a whole.
Both answer in a few index seeks: a probe may come every second.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reactor._engine.port import EnginePort
from reactor._engine.report import upkeep_report
from reactor.errors import ReactorError

__all__ = ["DEFAULT_MAX_LAG", "create_health_app", "problems"]

DEFAULT_MAX_LAG: Final = 60.0  # seconds the upkeep may fall behind before it is unhealthy


def problems(report: dict[str, Any], max_lag: float, *, whole: bool) -> list[str]:
    """What is wrong with the upkeep's ``report`` (``upkeep_report``): this process's
    upkeep, and the database's as a whole as well if ``whole``."""
    found: list[str] = []
    if not report["running"]:
        found.append("the upkeep's thread is not running")
    age = report["last_round_age"]
    if age is not None and age > max_lag:
        found.append(f"the upkeep's last round ended {age:.1f} s ago (more than {max_lag:g} s)")
    if whole and report["overdue"] > max_lag:
        found.append(
            f"the oldest due work has waited {report['overdue']:.1f} s (more than {max_lag:g} s)"
        )
    return found


def create_health_app(engine: EnginePort, max_lag: float = DEFAULT_MAX_LAG) -> Starlette:
    """The health endpoints of ``engine``'s upkeep, unhealthy past ``max_lag`` seconds."""

    async def report() -> dict[str, Any]:
        return await run_in_threadpool(upkeep_report, engine)

    async def livez(_request: Request) -> JSONResponse:
        progress = engine.upkeep_progress()
        if progress is None:
            return _answer(["the database is open read-only: there is no upkeep"])
        # From memory, no database read: a wedged database fails readiness, not this.
        found = problems(
            {
                "running": progress.running,
                "last_round_age": None
                if progress.last_round is None
                else _age(progress.last_round),
                "overdue": 0.0,
            },
            max_lag,
            whole=False,
        )
        return _answer(found)

    async def healthz(_request: Request) -> JSONResponse:
        try:
            upkeep = await report()
        except ReactorError as exc:
            return _answer([f"the database cannot be read: {exc}"])
        found = problems(upkeep, max_lag, whole=True)
        return _answer(found, database=engine.store.location, pid=os.getpid(), upkeep=upkeep)

    return Starlette(routes=[Route("/livez", livez), Route("/healthz", healthz)])


def _age(monotonic: float) -> float:
    return round(time.monotonic() - monotonic, 3)


def _answer(found: list[str], **fields: Any) -> JSONResponse:
    status = "failing" if found else "ok"
    return JSONResponse(
        {"status": status, "problems": found, **fields}, status_code=503 if found else 200
    )
