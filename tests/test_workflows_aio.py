"""Durable workflows from asyncio (SPEC §14): ``async def`` workflows with ``await
run.step(...)`` (a step's function may be a coroutine function), the same records as
sync ones, both kinds served by the same workers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import reactor
import reactor.aio


async def test_async_workflows_record_their_steps_like_sync_ones(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:

        async def fetch(n: int) -> int:
            await asyncio.sleep(0.01)
            return n * 2

        @state.workflow("double")
        async def double(run: reactor.aio.AsyncRun, n: int) -> dict[str, Any]:
            doubled = await run.step("fetch", fetch, n)
            plain = await run.step("plain", lambda: doubled + 1)
            note = await run.receive("note")
            return {"doubled": doubled, "plain": plain, "note": note}

        @state.workflow("sync")
        def sync(run: reactor.Run, n: int) -> int:
            return int(run.step("inc", lambda: n + 1))

        first = await state.start("double", 21, id="d-1")
        other = await state.start("sync", 1)
        async with await state.serve(concurrency=2) as workers:
            assert workers.workflows == ["double", "sync"]
            assert await other.result(timeout=10) == 2
            while await first.status() != "suspended":
                await asyncio.sleep(0.02)
            await state.send("d-1", "note", "hi")
            assert await first.result(timeout=10) == {"doubled": 42, "plain": 43, "note": "hi"}
        info = await state.run_info("d-1")
        assert [(s.name, s.status) for s in info.steps] == [
            ("fetch", "succeeded"),
            ("plain", "succeeded"),
            ("receive:note", "succeeded"),
        ]
        assert [run.id for run in await state.runs(workflow="double")] == ["d-1"]
        assert (await state.run("d-1")).workflow == "double"
        assert await state.cancel("d-1") is False


async def test_an_async_step_that_raises_is_retried_then_raised(db_path: Any) -> None:
    async with reactor.aio.open(db_path) as state:
        tries: list[int] = []

        async def flaky() -> str:
            tries.append(1)
            raise ConnectionError("down")

        @state.workflow("flaky")
        async def flaky_flow(run: reactor.aio.AsyncRun, _input: Any) -> Any:
            try:
                await run.step("call", flaky, retries=2, backoff=0.01)
            except reactor.StepFailedError as exc:
                return exc.error
            return None

        handle = await state.start("flaky")
        async with await state.serve():
            assert await handle.result(timeout=10) == {"type": "ConnectionError", "message": "down"}
        assert len(tries) == 3
        with pytest.raises(KeyError):
            await state.run_info("nobody")


async def test_closing_the_state_under_serving_workers_stops_their_threads(
    db_path: Any,
) -> None:
    """Many async runs waiting on messages, one inside a step: ``await state.close()``
    with no ``stop()`` first leaves no thread of reactor's; a new handle finishes them."""
    before = set(threading.enumerate())
    state = reactor.aio.open(db_path)

    @state.workflow("inbox")
    async def inbox(run: reactor.aio.AsyncRun, _input: Any) -> Any:
        await run.step("slow", asyncio.sleep, 0.3)
        return await run.receive("go")

    handles = [await state.start("inbox", None, id=f"r{n}") for n in range(20)]
    await state.serve(concurrency=4)
    while sum([await handle.status() == "suspended" for handle in handles]) < 10:
        await asyncio.sleep(0.02)
    await state.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("reactor")]
    assert left == []
    async with reactor.aio.open(db_path) as again:
        again.workflow("inbox")(inbox)
        for n in range(20):
            await again.send(f"r{n}", "go", n)
        async with await again.serve(concurrency=4):
            results = [await (await again.run(f"r{n}")).result(timeout=20) for n in range(20)]
        assert results == list(range(20))
