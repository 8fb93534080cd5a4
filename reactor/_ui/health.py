"""The health of a ``reactor serve`` process, over HTTP (``--health PORT``).

```text
GET /livez    200 {"status": "ok"}, or 503 {"status": "failing", "problems": [...]}:
              this process's upkeep is stuck (its thread ended, or one chore has run
              longer than the allowed lag). A supervisor restarts the process.
GET /healthz  the same, and 503 when the database cannot be read (within 5 s), the
              upkeep has failed for longer than the allowed lag, or the oldest due
              work (a key past its deadline, a due timer, a lease run out) has waited
              longer than that, whoever should do it: {"status", "problems",
              "database", "pid", "upkeep": stats()["upkeep"]}.
```

Liveness looks at this process only, so that a slow database does not get every
server restarted; readiness and monitoring look at the database's upkeep as a whole.
Both answer in a few index seeks: a probe may come every second.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reactor._engine.port import EnginePort
from reactor._engine.report import upkeep_progress, upkeep_report
from reactor._work.sweeper import RETRY_PAUSE
from reactor.errors import ReactorError

__all__ = ["DEFAULT_MAX_LAG", "create_health_app", "problems"]

DEFAULT_MAX_LAG: Final = 60.0  # seconds the upkeep may fall behind before it is unhealthy
READ_TIMEOUT: Final = 5.0  # seconds a readiness probe waits for the database at most


def problems(
    report: dict[str, Any],
    max_lag: float,
    *,
    whole: bool,
    timeout: float = 0.0,
    rest: float = 0.0,
) -> list[str]:
    """What is wrong with the upkeep's ``report`` (``upkeep_report``): this process's
    upkeep, and, if ``whole``, its failures and the database's upkeep as a whole.

    A round that fails, or waits for another process's lock, is still a sign of life:
    liveness fails only when the thread is gone, one chore has run for ``max_lag``
    longer than its wait's ``timeout`` (a wait that should have timed out has not), or
    no chore has begun for ``max_lag`` longer than the ``rest`` the thread takes between
    two rounds at most (its interval, and the pause after a round that failed)."""
    found: list[str] = []
    if not report["running"]:
        found.append("the upkeep's thread is not running")
        if report["last_error"]:
            found.append(f"its last round failed: {report['last_error']}")
        return found
    busy, idle = report["busy_for"], report["last_round_age"]
    if busy is not None and busy > max_lag + timeout:
        found.append(
            f"the upkeep's chore under way has run for {busy:.1f} s (more than "
            f"{max_lag + timeout:g} s: its timeout and the allowed lag)"
        )
    elif busy is None and idle is not None and idle > max_lag + rest:
        found.append(
            f"the upkeep's last round ended {idle:.1f} s ago (more than {max_lag + rest:g} s: "
            "its rest between rounds and the allowed lag)"
        )
    if not whole:
        return found
    failing_for = report["failing_for"]
    if failing_for is not None and failing_for > max_lag:
        found.append(
            f"the upkeep has failed for {failing_for:.1f} s ({report['failing']} rounds in a "
            f"row): {report['last_error']}"
        )
    if report["overdue"] > max_lag:
        found.append(
            f"the oldest due work has waited {report['overdue']:.1f} s (more than {max_lag:g} s)"
        )
    return found


def create_health_app(engine: EnginePort, max_lag: float = DEFAULT_MAX_LAG) -> Starlette:
    """The health endpoints of ``engine``'s upkeep, unhealthy past ``max_lag`` seconds.

    The database is read by one probe at a time: a probe that comes while another's
    read is under way waits for that read (a locked table ties up one connection, not
    one per probe), and none waits more than ``READ_TIMEOUT`` seconds."""
    reading: list[asyncio.Future[dict[str, Any]]] = []  # the read under way, if any
    timeout = engine.options.timeout
    rest = engine.options.sweep_interval + RETRY_PAUSE  # between two rounds, at most

    async def report() -> dict[str, Any]:
        if not reading or reading[0].done():
            reading[:] = [asyncio.ensure_future(run_in_threadpool(upkeep_report, engine))]
        return await asyncio.wait_for(asyncio.shield(reading[0]), READ_TIMEOUT)

    async def livez(_request: Request) -> JSONResponse:
        if engine.upkeep_progress() is None:
            return _answer(["the database is open read-only: there is no upkeep"])
        # From memory, no database read: a wedged database fails readiness, not this.
        found = problems(upkeep_progress(engine), max_lag, whole=False, timeout=timeout, rest=rest)
        return _answer(found)

    async def healthz(_request: Request) -> JSONResponse:
        try:
            upkeep = await report()
        except ReactorError as exc:
            return _answer([f"the database cannot be read: {exc}"])
        except TimeoutError:
            return _answer([f"the database did not answer within {READ_TIMEOUT:g} s"])
        found = problems(upkeep, max_lag, whole=True, timeout=timeout, rest=rest)
        return _answer(found, database=engine.store.location, pid=os.getpid(), upkeep=upkeep)

    return Starlette(routes=[Route("/livez", livez), Route("/healthz", healthz)])


def _answer(found: list[str], **fields: Any) -> JSONResponse:
    status = "failing" if found else "ok"
    return JSONResponse(
        {"status": status, "problems": found, **fields}, status_code=503 if found else 200
    )
