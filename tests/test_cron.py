"""Cron timers (SPEC §13, "Cron timers"): a timer fires at each time a five-field cron
expression names, in an IANA zone, exactly once per due time, once after missed
periods; bad expressions and zones are typed errors. The times below were worked out
by hand from the expressions and the zones' rules, not computed by the library under
test."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import textwrap
import zoneinfo
from pathlib import Path
from typing import Any

import pytest

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import CLI_ON_SQLITE

from .conftest import run_reactor

UTC = dt.UTC
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def _at(year: int, month: int, day: int, hour: int, minute: int, zone: Any = UTC) -> float:
    return dt.datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()


def _fired(state: reactor.State, timer: reactor.Timer) -> list[Any]:
    return [e.new_value for e in state.changes() if e.timer == timer.id]


def _local(epoch: float, zone: Any = UTC) -> str:
    return dt.datetime.fromtimestamp(epoch, zone).isoformat()


def test_a_cron_timer_is_due_at_the_next_time_its_expression_names(
    state: reactor.State, clock: ManualClock
) -> None:
    clock.set(_at(2026, 1, 2, 17, 30))  # a Friday, after 9:00
    timer = state.scope("s").schedule("standup", "ring", cron="0 9 * * MON-FRI")
    assert timer == reactor.Timer(
        timer.id, "s", "standup", _at(2026, 1, 5, 9, 0), None, "0 9 * * MON-FRI", "UTC"
    )  # Monday: the weekend passes over
    assert state.timers() == [timer]
    zoned = state.scope("s").schedule("lunch", "eat", cron="0  12 * * *", tz="Europe/Paris")
    assert zoned.due == _at(2026, 1, 3, 11, 0)  # noon in Paris, UTC+1 in winter
    assert (zoned.cron, zoned.tz) == ("0 12 * * *", "Europe/Paris")  # fields as one space


def test_a_cron_timer_fires_once_per_due_time_and_once_after_missed_periods(
    state: reactor.State, clock: ManualClock
) -> None:
    clock.set(_at(2026, 1, 5, 8, 58))
    scope = state.scope("s")
    timer = scope.schedule("n", ops=[ops.increment("")], cron="*/15 * * * *")
    assert timer.due == _at(2026, 1, 5, 9, 0)
    for minutes, expected in [(1, 0), (2, 1), (10, 1), (5, 2), (1, 2)]:  # 8:59 ... 9:16
        clock.advance(minutes * 60)
        run_upkeep(state)
        assert scope.get("n", 0) == expected, _local(clock.time())
    assert [t.due for t in state.timers()] == [_at(2026, 1, 5, 9, 30)]
    clock.advance(5 * 3600)  # 14:16: twenty periods missed, one firing
    run_upkeep(state)
    assert scope.get("n") == 3
    assert [t.due for t in state.timers()] == [_at(2026, 1, 5, 14, 30)]
    assert _fired(state, timer) == [1, 2, 3]


def test_local_wall_clock_times_across_daylight_saving_changes(
    state: reactor.State, clock: ManualClock
) -> None:
    """New York, 2026: clocks go 2:00 -> 3:00 on March 8 and 2:00 -> 1:00 on
    November 1. A time the spring change skips fires once, right after the change; a
    time the autumn change repeats fires once, the first time (Debian cron's rules)."""
    scope = state.scope("s")
    clock.set(_at(2026, 3, 7, 12, 0, NEW_YORK))
    spring = scope.schedule("spring", ops=[ops.increment("")], cron="30 2 * * *", tz=NEW_YORK.key)
    dues = []
    for _ in range(3):
        (pending,) = [t for t in state.timers() if t.id == spring.id]
        dues.append(_local(pending.due, NEW_YORK))
        clock.set(pending.due + 1)
        run_upkeep(state)
    assert dues == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]
    assert scope.get("spring") == 3
    assert state.cancel_timer(spring.id)

    clock.set(_at(2026, 10, 31, 12, 0, NEW_YORK))
    autumn = scope.schedule("autumn", ops=[ops.increment("")], cron="30 1 * * *", tz=NEW_YORK.key)
    dues = []
    for _ in range(2):
        (pending,) = [t for t in state.timers() if t.id == autumn.id]
        dues.append(pending.due)
        clock.set(pending.due + 1)
        run_upkeep(state)
    first_half_past_one = _at(2026, 11, 1, 5, 30)  # 1:30 EDT (UTC-4)
    assert dues == [first_half_past_one, _at(2026, 11, 2, 6, 30)]  # then 1:30 EST (UTC-5)
    clock.set(first_half_past_one + 3600 + 1)  # 1:30 EST on Nov 1: the repeat, not again
    run_upkeep(state)
    assert scope.get("autumn") == 2


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"cron": "* * * *"}, "five standard fields"),
        ({"cron": "0 * * * * *"}, "five standard fields"),  # seconds: not standard
        ({"cron": "0 0 31 2 *"}, "not a cron expression"),  # February has no 31st
        ({"cron": "@daily"}, "five standard fields"),
        ({"cron": ""}, "five standard fields"),
        ({"cron": 5}, "cron is a str"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "not an IANA time zone"),
        ({"cron": "* * * * *", "tz": "../../etc/passwd"}, "not an IANA time zone"),
        ({"cron": "* * * * *", "tz": 1}, "IANA time zone name"),
        ({"tz": "UTC", "after": 5}, "give cron= too"),
        ({"cron": "* * * * *", "every": 60}, "not with after=, at= or every="),
        ({"cron": "* * * * *", "after": 60}, "not with after=, at= or every="),
        ({"cron": "* * * * *", "at": 1e9}, "not with after=, at= or every="),
    ],
)
def test_a_bad_cron_timer_is_a_typed_error_and_schedules_nothing(
    state: reactor.State, arguments: dict[str, Any], says: str
) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match=says):
        state.scope("s").schedule("k", 1, **arguments)
    assert state.timers() == []


def test_a_transaction_schedules_a_cron_timer_with_its_commit(
    state: reactor.State, clock: ManualClock
) -> None:
    clock.set(_at(2026, 1, 5, 8, 0))
    with pytest.raises(RuntimeError), state.scope("s").transaction() as tx:
        tx.schedule("k", 1, cron="0 9 * * *")
        raise RuntimeError("rolled back")
    assert state.timers() == []
    with state.scope("s").transaction() as tx:
        tx.set("other", 1)
        timer = tx.schedule("k", 1, cron="0 9 * * *")
    assert state.timers() == [timer]
    assert timer.due == _at(2026, 1, 5, 9, 0)


def test_the_asyncio_twin(db_path: Any) -> None:
    async def main() -> reactor.Timer:
        async with reactor.aio.open(db_path) as state:
            return await state.scope("s").schedule("k", 1, cron="0 0 1 1 *", tz="Asia/Tokyo")

    timer = asyncio.run(main())
    now = dt.datetime.now(zoneinfo.ZoneInfo("Asia/Tokyo"))
    new_year = dt.datetime(now.year + 1, 1, 1, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))
    assert timer.due == new_year.timestamp()
    assert (timer.cron, timer.tz) == ("0 0 1 1 *", "Asia/Tokyo")


@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_the_command_line_and_an_export_keep_the_expression_and_zone(
    db_path: Any, fresh_db: Any, tmp_path: Path
) -> None:
    def cli(database: Any, *args: str) -> Any:
        done = run_reactor("--db", str(database), "--json", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else None

    added = cli(db_path, "timers", "add", "s", "k", '"hi"', "--cron", "0 9 * * 1", "--tz", "UTC")
    assert (added["cron"], added["tz"], added["every"]) == ("0 9 * * 1", "UTC", None)
    table = run_reactor("--db", str(db_path), "--table", "timers", cwd=tmp_path)
    assert "0 9 * * 1 (UTC)" in table.stdout
    bad = run_reactor(
        "--db", str(db_path), "timers", "add", "s", "k", "1", "--cron", "x", cwd=tmp_path
    )
    assert bad.returncode == 2  # usage: a bad --cron
    assert "five standard fields" in bad.stderr
    assert "Traceback" not in bad.stderr
    cli(db_path, "export", "backup.jsonl")
    (line,) = [
        json.loads(text)
        for text in (tmp_path / "backup.jsonl").read_text().splitlines()
        if "timer" in json.loads(text)
    ]
    assert (line["cron"], line["tz"]) == ("0 9 * * 1", "UTC")
    cli(fresh_db, "import", "backup.jsonl")
    with reactor.open(fresh_db) as state:
        (restored,) = state.timers()
    assert restored.id == added["id"]
    assert (restored.cron, restored.tz) == ("0 9 * * 1", "UTC")
    assert abs(restored.due - added["due"]) < 5  # due_in carried over: the same time


FIRER = """
    import sys
    import reactor
    from reactor.testing import ManualClock, run_upkeep

    clock = ManualClock(float(sys.argv[2]))
    with reactor.open(sys.argv[1], clock=clock, sweep_interval=0.02) as state:
        print("ready", flush=True)
        for line in sys.stdin:
            clock.advance(float(line))
            run_upkeep(state)  # racing the other processes' and its own sweeper
            print("done", flush=True)
"""


def test_processes_racing_fire_a_cron_timer_once_per_due_time(db_path: Any) -> None:
    """Three processes, their clocks moved together, each sweeping every 20 ms and
    running the upkeep at each step: each due time fires once, missed ones once."""
    start = _at(2026, 1, 5, 8, 58)
    with reactor.open(db_path, clock=ManualClock(start), sweep_interval=1e6) as state:
        timer = state.scope("s").schedule("n", ops=[ops.increment("")], cron="*/5 * * * *")
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(FIRER), str(db_path), str(start)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for run in runs:
            assert run.stdout is not None
            assert run.stdout.readline().strip() == "ready"
        # 9:00:30 (fires 9:00), 9:05:30 (9:05), 9:08:00 (none), 9:10:30 (9:10), then
        # 10:10:30 (eleven periods missed: once)
        for seconds in (150, 300, 150, 150, 3600):
            for run in runs:
                assert run.stdin is not None
                run.stdin.write(f"{seconds}\n")
                run.stdin.flush()
            for run in runs:
                assert run.stdout is not None
                assert run.stdout.readline().strip() == "done"
    finally:
        for run in runs:
            assert run.stdin is not None
            run.stdin.close()
        codes = [run.wait(timeout=60) for run in runs]
        for run in runs:
            assert run.stdout is not None
            run.stdout.close()
    assert codes == [0, 0, 0]
    with reactor.open(db_path, clock=ManualClock(start + 4350), sweep_interval=1e6) as state:
        assert _fired(state, timer) == [1, 2, 3, 4]
        assert state.scope("s").get("n") == 4
        assert [t.due for t in state.timers()] == [_at(2026, 1, 5, 10, 15)]
