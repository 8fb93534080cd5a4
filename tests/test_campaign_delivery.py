"""The cross-process delivery checker (SPEC §7): every consumer sees the change log.

Writer processes commit single writes, large ``set_many`` batches, transactions, keys
with short TTLs (expired by every process's sweeper) and compactions of the log, all at
once. Consumer processes, started first, follow the database with a subscription, a
watch, a ``reactor.signals.changed`` receiver and a durable subscriber, while faults
are injected into their reads of the change log (one read in twenty fails) and, on
PostgreSQL, the server kills their connections again and again.

When the writers are done, every consumer's sequence must be the change log exactly:
every revision from where it began to the last one, in order, no gap, no repeat, and
each event equal to its record in the log.

Bounded in CI (a few seconds of writing per backend); ``-m slow`` writes for longer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import reactor
from tests.conftest import engine_of

RETENTION = 4_000  # well under what the writers log even on a slow machine: compaction runs

CONSUMER = """
    import json, random, sys, threading, time
    from pathlib import Path
    import reactor
    from reactor._handles.binding import engine_of
    from reactor.errors import StorageError

    db, out, seed, patience = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    rng = random.Random(seed)
    state = reactor.open(db, log_retention=RETENTION)
    engine = engine_of(state)
    real_log_after = engine.store.log_after

    def flaky_log_after(*args, **kwargs):
        if rng.random() < 0.05:
            raise StorageError("injected: reading the change log failed")
        return real_log_after(*args, **kwargs)

    engine.store.log_after = flaky_log_after  # faults in every reader of the log
    seen = {"subscription": [], "watch": [], "signal": [], "durable": []}

    def recorder(name):
        def record(event):
            seen[name].append([event.revision, event.scope, event.key, event.type])
        return record

    start = engine.store.revision()
    state.subscribe(recorder("subscription"), since=start)
    state.subscribe(recorder("durable"), since=start, durable=f"checker-{seed}")
    signal_receiver = recorder("signal")
    reactor.signals.changed.connect(lambda _sender, event: signal_receiver(event), weak=False)
    watch = state.watch(since=start)

    def iterate():
        for event in watch:
            seen["watch"].append([event.revision, event.scope, event.key, event.type])

    threading.Thread(target=iterate, daemon=True).start()
    print(json.dumps({"start": start}), flush=True)
    final = int(sys.stdin.readline())  # the writers are done: the last revision
    # A durable subscriber saves each position (a commit per event): it catches up at
    # the database's commit rate. Patience counts from the last progress, up to 5 min.
    deadline = time.monotonic() + patience
    give_up = time.monotonic() + 300
    progress = None
    while time.monotonic() < min(deadline, give_up):
        if all(items and items[-1][0] >= final for items in seen.values()):
            break
        now = [len(items) for items in seen.values()]
        if now != progress:
            progress, deadline = now, time.monotonic() + patience
        time.sleep(0.05)
    time.sleep(0.3)  # a repeat, if any, would arrive now
    watch.close()
    out.write_text(json.dumps({"start": start, "seen": seen}))
    state.close()
"""

WRITER = """
    import random, sys, time
    import reactor
    from reactor._handles.binding import engine_of

    db, role, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rng = random.Random(role)
    state = reactor.open(db, log_retention=RETENTION)
    engine = engine_of(state)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        if role == "single":
            scope = state.scope("single")
            scope.set(f"k{rng.randrange(50)}", i)
            scope.increment("n")
            if i % 7 == 0:
                scope.delete(f"k{rng.randrange(50)}")
        elif role == "bulk":
            scope = state.scope("bulk")
            scope.set_many({f"b{n:05}": i for n in range(2500)})
            if i % 2 == 0:
                scope.clear("b0*")
            time.sleep(0.3)
        else:
            try:
                with state.scope("tx").transaction() as tx:
                    tx.increment("count")
                    tx.set(f"t{i % 20}", i)
                    tx.push("list", i)
                    if len(tx.get("list")) > 20:
                        tx.delete("list")
            except reactor.ConflictError:
                pass
            state.scope("ttl").set(f"e{i}", i, ttl=rng.choice([0.05, 0.2, 0.5]))
            if i % 50 == 0:
                engine.sweeper.compact()
    state.close()
"""


def _python(code: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    source = f"RETENTION = {RETENTION}\n" + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", source, *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class ConnectionKiller:
    """On PostgreSQL, terminates the consumers' connections every ``every`` seconds."""

    def __init__(self, url: str, every: float) -> None:
        import psycopg

        admin = sa.make_url(url).set(drivername="postgresql", query={})
        self._conn = psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True)
        self._every = every
        self._stop = threading.Event()
        self.kills = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            rows = self._conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'reactor-consumer'"
            ).fetchall()
            self.kills += len(rows)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._conn.close()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)  # reaped, and its pipes closed


def _run_campaign(
    db_path: Any, tmp_path: Path, processes: list[Any], seconds: float, patience: float = 90.0
) -> None:
    """``seconds`` of writing; then each consumer has ``patience`` seconds to catch up."""
    db = str(db_path)
    postgres = db.startswith("postgresql")
    consumer_db = f"{db}&application_name=reactor-consumer" if postgres else db
    outputs = [tmp_path / f"consumer-{n}.json" for n in range(2)]
    consumers = [
        _python(CONSUMER, consumer_db, str(out), str(n), str(patience), stdin=True)
        for n, out in enumerate(outputs)
    ]
    processes.extend(consumers)
    for consumer in consumers:
        assert consumer.stdout is not None
        line = consumer.stdout.readline()
        assert line, consumer.stderr.read() if consumer.stderr else "no output"
    killer = ConnectionKiller(db, every=0.3) if postgres else None
    writers = [_python(WRITER, db, role, str(seconds)) for role in ("single", "bulk", "tx")]
    processes.extend(writers)
    try:
        for writer in writers:
            _, err = writer.communicate(timeout=seconds + 120)
            assert writer.returncode == 0, err
    finally:
        if killer is not None:
            killer.stop()
    with reactor.open(db) as state:
        engine = engine_of(state)
        final = _settled_revision(engine)
        log = {
            event.revision: [event.revision, event.scope, event.key, event.type]
            for event in state.changes()
        }
    for consumer in consumers:
        assert consumer.stdin is not None
        consumer.stdin.write(f"{final}\n")
        consumer.stdin.flush()
    for consumer in consumers:
        _, err = consumer.communicate(timeout=360)
        assert consumer.returncode == 0, err
    kinds: dict[str, int] = {}
    for item in log.values():
        kinds[item[3]] = kinds.get(item[3], 0) + 1
    for out in outputs:
        result = json.loads(out.read_text())
        start = result["start"]
        for name, seen in result["seen"].items():
            revisions = [item[0] for item in seen]
            first = start + 1 if name != "signal" else revisions[0]
            assert revisions == list(range(first, final + 1)), (
                f"{out.name} {name}: not every revision from {first} to {final} once, in order"
            )
            wrong = [item for item in seen if item[0] in log and item != log[item[0]]]
            assert wrong == [], f"{out.name} {name}: events that differ from the log"
    print(
        f"{final} revisions ({len(log)} retained: {kinds}); 2 consumers x 4 feeds each "
        f"saw every one once, in order"
        + (f"; {killer.kills} consumer connections killed" if killer else "")
    )
    assert kinds.get("expired", 0) > 0, "no expiry happened: the campaign missed a family"
    assert len(log) < final, "no compaction happened: the campaign missed a family"


def _settled_revision(engine: Any) -> int:
    """The last revision, once every TTL key has been expired and nothing moves."""
    deadline = time.monotonic() + 30
    last = -1
    while time.monotonic() < deadline:
        revision = engine.store.revision()
        if revision == last and not engine.store.expired(engine.now() + 1.0, 1):
            return revision
        last = revision
        time.sleep(0.5)
    raise AssertionError("the database never settled")


@pytest.mark.timeout(600)  # about 20 s on a quiet machine; minutes beside CPU burners
def test_every_consumer_sees_the_change_log_exactly(
    db_path: Any, tmp_path: Path, processes: list[Any]
) -> None:
    # PostgreSQL commits a durable subscriber's positions a few times slower: less to
    # catch up on keeps the run short. A loaded machine slows the consumers more than
    # the writers: they get the patience for it.
    postgres = str(db_path).startswith("postgresql")
    _run_campaign(db_path, tmp_path, processes, seconds=1.5 if postgres else 4.0, patience=180.0)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_consumer_sees_the_change_log_exactly_for_a_minute(
    db_path: Any, tmp_path: Path, processes: list[Any], request: pytest.FixtureRequest
) -> None:
    if "slow" not in request.config.getoption("markexpr"):
        pytest.skip("a long campaign: run it with -m slow")
    # Over a million revisions: the durable subscribers, a commit per event, take
    # minutes to catch up once the writers stop.
    _run_campaign(db_path, tmp_path, processes, seconds=60.0, patience=900.0)
