"""A report on weekday mornings: a cron timer, a subscriber that queues the day's job,
and a worker.

    python examples/nightly_report.py            # a database in a temporary folder
    python examples/nightly_report.py state.db   # that file

The cron timer "30 6 * * MON-FRI" in Europe/Paris fires at 6:30 Paris time, Monday to
Friday, across the change to summer time (the offset goes from +01:00 to +02:00; the
wall-clock time stays 6:30). Each firing is an ordinary write (a counter in scope
"schedule"), whose event carries the timer's id: a subscriber turns it into a job of the
queue "reports", with the day as the job's idempotency key, so a firing seen twice
queues one report. A worker takes and acknowledges the jobs.

The clock is moved by hand (``reactor.testing.ManualClock``) so that two weeks pass in
a second: a server that was down from Wednesday to Friday noon gets one report for the
missed mornings, not three, and the timer goes on from the next Monday.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import zoneinfo
from pathlib import Path

import reactor
from reactor import ops
from reactor.testing import ManualClock, run_upkeep

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
CRON = "30 6 * * MON-FRI"


def local(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, PARIS).strftime("%a %Y-%m-%d %H:%M %z")


def main(path: str) -> None:
    # Thursday 26 March 2026, noon in Paris; clocks go forward on Sunday the 29th.
    clock = ManualClock(dt.datetime(2026, 3, 26, 12, 0, tzinfo=PARIS).timestamp())
    with reactor.open(path, clock=clock, sweep_interval=1e6) as state:
        reports = state.queue("reports")
        state.scope("schedule").clear()  # a second run on the same file starts afresh
        for left in state.timers("schedule"):
            state.cancel_timer(left.id)

        def queue_report(event: reactor.ChangeEvent) -> None:
            if event.timer is None:
                return  # a write of someone else's
            day = event.timestamp.astimezone(PARIS).date().isoformat()
            reports.put({"day": day}, key=f"report-{day}")

        subscription = state.subscribe(queue_report, scope="schedule", key="mornings")
        timer = state.scope("schedule").schedule(
            "mornings", ops=[ops.increment("")], cron=CRON, tz=PARIS.key
        )
        print(f"scheduled {CRON!r} in {timer.tz}: first at {local(timer.due)}")

        done: list[str] = []

        def work() -> None:
            job = reports.take(timeout=5)
            assert job is not None, "the subscriber queues a report per firing"
            done.append(job.item["day"])
            print(f"  report for {job.item['day']} done")
            job.ack()

        for _ in range(4):  # Friday, then (the weekend passed) Monday to Wednesday
            (pending,) = state.timers("schedule")
            clock.set(pending.due + 60)  # a minute after it was due
            print(f"{local(clock.time())}  upkeep fired {run_upkeep(state).timers_fired}")
            work()

        # Down from Wednesday morning to Friday noon: Thursday and Friday were missed.
        clock.set(dt.datetime(2026, 4, 3, 12, 0, tzinfo=PARIS).timestamp())
        fired = run_upkeep(state).timers_fired
        print(f"{local(clock.time())}  back after 2 missed mornings: fired {fired}")
        work()
        (pending,) = state.timers("schedule")
        print(f"next: {local(pending.due)}")
        subscription.close()

        assert fired == 1
        assert done == ["2026-03-27", "2026-03-30", "2026-03-31", "2026-04-01", "2026-04-03"]
        assert state.scope("schedule").get("mornings") == 5
        counts = reports.stats()
        assert [counts[state] for state in ("ready", "delayed", "taken", "dead")] == [0, 0, 0, 0]
        print(f"reports: {done}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(str(Path(folder) / "state.db"))
