"""An asyncio job service: async workers, a live change feed, an async subscriber.

    python examples/asyncio_service.py            # a database in a temporary folder
    python examples/asyncio_service.py state.db   # that file

``reactor.aio`` has the verbs as coroutines; none of them blocks the event loop. Jobs
are keys of the scope "jobs", and the queue is a list in it: workers ``pop`` job ids
(atomic: each job goes to exactly one worker) and move each job on with update ops. A
feed (``async for event in state.watch(...)``) prints each change as it commits, and an
``async def`` subscriber, run on the loop, counts the finished jobs and tells the
service when all are done.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import reactor
import reactor.aio
from reactor import ops

JOBS = 6
WORKERS = 3
TIMEOUT = 10.0  # seconds: the service needs a fraction of one


async def worker(jobs: reactor.aio.AsyncScope, name: str) -> None:
    while (job := await jobs.pop("queue", front=True)) is not None:
        running = await jobs.update(job, [ops.set("status", "running"), ops.set("worker", name)])
        number = running.new_value["number"]  # a write returns the value it made
        await asyncio.sleep(0.01)  # the work: other tasks run meanwhile
        await jobs.update(job, [ops.set("status", "done"), ops.set("result", number**2)])


async def feed(state: reactor.aio.AsyncState, since: int) -> None:
    """Print every change to a job, from revision ``since`` on, until all are done."""
    done = 0
    async with state.watch(since=since, scope="jobs", key="job-*") as changes:
        async for event in changes:
            job = event.new_value
            by = job.get("worker", "-")
            print(f"rev {event.revision:3}  {event.key}  {job['status']:8} {by}")
            done += job["status"] == "done"
            if done == JOBS:
                return


async def run(path: Path) -> None:
    async with reactor.aio.open(path) as state:
        jobs, metrics = state.scope("jobs"), state.scope("metrics")
        await jobs.clear()  # start afresh when the same file is used twice
        await metrics.clear()

        all_done = asyncio.Event()

        async def on_done(event: reactor.ChangeEvent) -> None:
            # An async callback runs on this loop, and may await reactor itself.
            await metrics.increment(f"done_by:{event.new_value['worker']}")
            if await metrics.increment("jobs_done") == JOBS:
                all_done.set()

        subscription = await state.subscribe(
            on_done,
            scope="jobs",
            key="job-*",
            events={"updated"},
            where=lambda event: event.new_value["status"] == "done",
        )
        # The feed starts at this revision: it misses nothing written after, even if
        # its first read comes later.
        start = (await jobs.snapshot()).revision
        feeding = asyncio.create_task(feed(state, start))

        names = [f"job-{n}" for n in range(1, JOBS + 1)]
        await jobs.set_many(
            {name: {"number": n, "status": "queued"} for n, name in enumerate(names, 1)}
        )
        await jobs.push("queue", *names)
        await asyncio.gather(*(worker(jobs, f"w{n}") for n in range(1, WORKERS + 1)))

        await asyncio.wait_for(all_done.wait(), TIMEOUT)
        await asyncio.wait_for(feeding, TIMEOUT)
        subscription.close()

        results = {name: job["result"] for name, job in (await jobs.get_many(names)).items()}
        print("results:", results)
        print("metrics:", await metrics.list())
        assert results == {name: n * n for n, name in enumerate(names, 1)}


def main() -> None:
    if len(sys.argv) > 1:
        asyncio.run(run(Path(sys.argv[1])))
        return
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(run(Path(folder) / "state.db"))


if __name__ == "__main__":
    main()
