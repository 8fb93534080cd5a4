"""Crash loops (SPEC §8): SIGKILL at random moments, over and over, on one database.

A worker process writes without pause: sets (to a pool of keys that are overwritten, and
to keys of their own), ``increment`` on a counter, update ops on a document, transactions
that write two keys and a counter together, keys with a 0.2 s TTL that its sweeper
expires, and a lock lease (1 s TTL) that it takes and gives back, so that it sometimes
holds it when it dies. Its sweeper checkpoints the WAL every 0.25 s meanwhile. Before
each call it writes ``try ...`` to its output file, and ``ack ...`` once the call has
returned: so at the kill at most one write is in flight, and it is known.

After each kill, on the database as the dead process left it:

- ``PRAGMA integrity_check`` is ``ok`` (SQLite; on PostgreSQL the server rolls back the
  dead connection's transaction and there is no file to check);
- ``reactor.open`` works, with no repair: reactor logs no warning, and the worker had
  written nothing to its stderr before it died;
- every acknowledged write is there with its value, or the value of a later write to the
  same key; the write in flight may or may not have committed, but nothing else is there;
- each transaction is all or nothing: its two keys hold the same value, and its counter
  moved with them; each counter equals its last acknowledged value, or one more if an
  increment was in flight; each acknowledged increment (in any round) built on the one
  before it;
- the change log has no gap;
- the lock lease survives the crash until its TTL, then ``stats()["locks_held"]`` is 0
  and it can be taken, with a fencing token above every token handed out before;
- no TTL key is readable past its deadline.

At the end, every TTL key ever written has been expired exactly once (one ``expired``
record in the change log; the log is kept whole) and swept from the table.

The database is kept from round to round, so every round checks again everything
acknowledged so far. The default suite runs 12 rounds (6 on PostgreSQL); the long
campaign (200 rounds, about 9 minutes on SQLite) is behind the ``slow`` marker, and
skips itself unless ``-m`` selects it:

    .venv/bin/python -m pytest -m slow tests/test_crash.py -s

(``-s`` prints the figures: rounds, acknowledged writes, in-flight writes found
committed or not, kills with the lock held.) On PostgreSQL, add
``--backend=postgresql`` with ``REACTOR_TEST_POSTGRES_URL`` set. ``REACTOR_CRASH_SEED``
replays a campaign: each failure names its seed.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import reactor

from .conftest import raw_query

LOCK_TTL = 1.0
KEY_TTL = 0.2
POOL = 128  # overwritten keys k0..k127
PAIRS = 32  # transaction pairs a0/b0 .. a31/b31
RETENTION = 10**9  # keep the change log whole: every expiry is counted
KILL_AFTER = (0.3, 1.5)  # seconds after "ready"
ABSENT = object()

WORKER = textwrap.dedent(
    """
    import os, random, sys, time
    import reactor
    from reactor import ops

    path, seed, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lock_ttl, key_ttl = float(sys.argv[4]), float(sys.argv[5])
    pool, pairs = int(sys.argv[6]), int(sys.argv[7])
    rng = random.Random(seed)
    write, flush = sys.stdout.write, sys.stdout.flush

    def say(*parts):
        write(" ".join(map(str, parts)) + "\\n")
        flush()

    state = reactor.open(path, log_retention=int(sys.argv[8]))
    data, pairs_scope = state.scope("crash"), state.scope("crash-tx")
    cache = state.scope("crash-ttl")
    lock = state.lock("crash-lock", ttl=lock_ttl)
    held_until, free_until = None, time.time() + rng.uniform(0.0, lock_ttl / 2)
    parent, give_up = os.getppid(), time.monotonic() + 60  # never outlive the test
    say("ready")
    while True:
        v += 1
        if v % 256 == 0 and (os.getppid() != parent or time.monotonic() > give_up):
            sys.exit(3)
        now = time.time()
        if held_until is not None and now >= held_until:
            say("try unlock")
            lock.release()
            say("ack unlock", time.time())
            held_until, free_until = None, time.time() + rng.uniform(0.0, lock_ttl)
        elif held_until is None and now >= free_until:
            say("try lock", now)
            if lock.acquire(blocking=False):
                say("ack lock", lock.token, time.time())
                held_until = time.time() + rng.uniform(0.05, lock_ttl / 2)
            else:
                say("busy lock")
        r = rng.random()
        if r < 0.2:
            key = f"k{v % pool}"
            say("try set", key, v)
            data.set(key, v)
            say("ack set", key, v)
        elif r < 0.35:
            key = f"u{v}"
            say("try set", key, v)
            data.set(key, v)
            say("ack set", key, v)
        elif r < 0.5:
            say("try incr")
            n = data.increment("counter")
            say("ack incr", n)
        elif r < 0.65:
            say("try upd", v)
            doc = data.update("doc", [ops.increment("n"), ops.set("last", v)]).new_value
            say("ack upd", doc["n"], doc["last"])
        elif r < 0.85:
            j = v % pairs
            say("try tx", j, v)
            with pairs_scope.transaction() as tx:
                tx.set(f"a{j}", v)
                n = tx.increment("count")
                tx.set(f"b{j}", v)
            say("ack tx", j, v, n)
        else:
            key = f"t{v}"
            say("try ttl", key, time.time())
            cache.set(key, v, ttl=key_ttl)
            say("ack ttl", key, time.time())
    """
)


@dataclass
class Figures:
    rounds: int = 0
    acked: Counter[str] = field(default_factory=Counter)
    verified: int = 0  # acknowledged writes checked, summed over rounds
    in_flight: Counter[str] = field(default_factory=Counter)  # committed / not / unknown
    killed_holding_lock: int = 0
    lease_checked_alive: int = 0  # kills where the lease was seen held before its TTL
    largest_wal: int = 0  # bytes of the WAL left at a kill (the sweeper checkpoints it)
    seconds: float = 0.0
    checking: float = 0.0  # seconds spent checking the database after the kills

    def report(self) -> str:
        return (
            f"{self.rounds} rounds; {sum(self.acked.values())} acknowledged writes "
            f"({dict(sorted(self.acked.items()))}); {self.verified} checks of acknowledged "
            f"writes over all rounds; writes in flight at the kill: "
            f"{dict(sorted(self.in_flight.items()))}; killed holding the lock: "
            f"{self.killed_holding_lock} (lease seen alive after the kill: "
            f"{self.lease_checked_alive}); largest WAL at a kill {self.largest_wal} bytes; "
            f"{self.seconds:.1f} s, of which checking "
            f"{self.checking:.1f} s"
        )


@dataclass
class Model:
    """What the database may hold, from the acknowledgements so far."""

    values: dict[tuple[str, str], set[Any]] = field(default_factory=dict)  # (scope, key)
    counter: set[int] = field(default_factory=lambda: {0})
    doc: set[tuple[int, Any]] = field(default_factory=lambda: {(0, None)})
    tx_count: set[int] = field(default_factory=lambda: {0})
    ttl_keys: dict[str, float] = field(default_factory=dict)  # key -> when written, at the latest
    ttl_acked: set[str] = field(default_factory=set)
    next_value: int = 0
    last_token: int = 0
    acked: int = 0

    def allowed(self, scope: str, key: str) -> set[Any]:
        return self.values.get((scope, key), {ABSENT})


@dataclass
class Outcome:
    """One round's worker output, read after the kill."""

    pending: list[str] | None  # the write in flight at the kill
    lock_state: str  # "free", "held", "acquiring", "releasing"
    lock_try: float = 0.0  # when the last acquire began
    lock_ack: float = 0.0  # when the last acquire returned
    tx_before: set[int] = field(default_factory=set)  # the counts before that write
    counter_before: set[int] = field(default_factory=set)
    doc_before: set[tuple[int, Any]] = field(default_factory=set)


def _apply(model: Model, figures: Figures, lines: list[str], seed: int) -> Outcome:
    """Replay the acknowledgements into the model; each ack must build on the model."""
    pending: list[str] | None = None
    outcome = Outcome(None, "free")
    for line in lines:
        parts = line.split()
        word, kind, rest = parts[0], (parts[1:] or [""])[0], parts[2:]
        if word == "ready":
            continue
        if word == "busy":
            pytest.fail(f"seed {seed}: the worker found the lock taken: {line!r}")
        if word == "try":
            pending = [kind, *rest]
            if kind == "lock":
                outcome.lock_state, outcome.lock_try = "acquiring", float(rest[0])
            elif kind == "unlock":
                outcome.lock_state = "releasing"
            continue
        assert word == "ack", f"seed {seed}: unexpected line {line!r}"
        assert pending is not None, f"seed {seed}: {line!r} without its try"
        assert pending[0] == kind, f"seed {seed}: {line!r} after try {pending}"
        pending = None
        figures.acked[kind] += 1
        model.acked += 1
        _ack(model, outcome, kind, rest, seed)
    outcome.pending = pending
    outcome.tx_before = set(model.tx_count)
    outcome.counter_before, outcome.doc_before = set(model.counter), set(model.doc)
    return outcome


def _ack(model: Model, outcome: Outcome, kind: str, rest: list[str], seed: int) -> None:
    """One acknowledged write into the model."""
    if kind == "set":
        key, value = rest[0], int(rest[1])
        model.values[("crash", key)] = {value}
        model.next_value = max(model.next_value, value)
    elif kind == "incr":
        n = int(rest[0])
        assert n - 1 in model.counter, (
            f"seed {seed}: increment acknowledged {n}, but the counter could only be "
            f"{sorted(model.counter)} before it: an acknowledged increment was lost"
        )
        model.counter = {n}
    elif kind == "upd":
        n, last = int(rest[0]), int(rest[1])
        assert n - 1 in {count for count, _ in model.doc}, (
            f"seed {seed}: update acknowledged n={n} after {sorted(model.doc, key=str)}"
        )
        model.doc = {(n, last)}
        model.next_value = max(model.next_value, last)
    elif kind == "tx":
        j, value, n = rest[0], int(rest[1]), int(rest[2])
        assert n - 1 in model.tx_count, (
            f"seed {seed}: transaction acknowledged count={n} after "
            f"{sorted(model.tx_count)}: an acknowledged transaction was lost"
        )
        model.tx_count = {n}
        model.values[("crash-tx", f"a{j}")] = {value}
        model.values[("crash-tx", f"b{j}")] = {value}
        model.next_value = max(model.next_value, value)
    elif kind == "ttl":
        model.ttl_keys[rest[0]] = float(rest[1])
        model.ttl_acked.add(rest[0])
        model.next_value = max(model.next_value, int(rest[0][1:]))
    elif kind == "lock":
        token = int(rest[0])
        assert token > model.last_token, (
            f"seed {seed}: fencing token {token} after {model.last_token}"
        )
        model.last_token = token
        outcome.lock_state, outcome.lock_ack = "held", float(rest[1])
    elif kind == "unlock":
        outcome.lock_state = "free"


def _in_flight(model: Model, pending: list[str], kill_time: float) -> None:
    """Widen the model by the write in flight at the kill: it may have committed."""
    kind, *rest = pending
    if kind == "set":
        model.values.setdefault(("crash", rest[0]), {ABSENT}).add(int(rest[1]))
        model.next_value = max(model.next_value, int(rest[1]))
    elif kind == "incr":
        model.counter |= {n + 1 for n in model.counter}
    elif kind == "upd":
        value = int(rest[0])
        model.doc |= {(n + 1, value) for n, _ in model.doc}
        model.next_value = max(model.next_value, value)
    elif kind == "tx":
        value = int(rest[1])
        for name in ("a", "b"):
            model.values.setdefault(("crash-tx", f"{name}{rest[0]}"), {ABSENT}).add(value)
        model.tx_count |= {n + 1 for n in model.tx_count}
        model.next_value = max(model.next_value, value)
    elif kind == "ttl":
        model.ttl_keys[rest[0]] = kill_time
        model.next_value = max(model.next_value, int(rest[0][1:]))


def _stored(value: Any) -> Any:
    return ABSENT if value is None else value


def _fate(
    db: Any, outcome: Outcome, stored: dict[str, Any], snapshot: dict[str, Any], why: str
) -> str:
    """Whether the write in flight at the kill committed, where the database can tell;
    a transaction's counter moved with its pair, or not at all."""
    pending = outcome.pending or [""]
    if pending[0] == "set":
        return "committed" if stored.get(pending[1]) == int(pending[2]) else "rolled back"
    if pending[0] == "incr":
        committed = stored.get("counter", 0) not in outcome.counter_before
        return "committed" if committed else "rolled back"
    if pending[0] == "upd":
        doc = stored.get("doc", {"n": 0, "last": None})
        committed = (doc["n"], doc["last"]) not in outcome.doc_before
        return "committed" if committed else "rolled back"
    if pending[0] == "ttl":  # it may have expired since: ask the change log
        created = raw_query(
            db,
            "SELECT COUNT(*) FROM reactor_changes WHERE scope = 'crash-ttl' AND key = ? "
            "AND type = 'created'",
            (pending[1],),
        )
        return "committed" if created == [(1,)] else "rolled back"
    if pending[0] == "tx":
        committed = snapshot.get(f"a{pending[1]}") == int(pending[2])
        count = snapshot.get("count", 0)
        expected = {n + 1 for n in outcome.tx_before} if committed else outcome.tx_before
        assert count in expected, (
            f"the transaction in flight {'did' if committed else 'did not'} write its "
            f"pair, but the count is {count}, not one of {sorted(expected)} {why}"
        )
        return "committed" if committed else "rolled back"
    return "unknown"


def _verify(
    db: Any,
    model: Model,
    outcome: Outcome,
    kill_time: float,
    figures: Figures,
    seed: int,
    sqlite: bool,
) -> str:
    """Check the database against the model; say whether the write in flight committed."""
    why = (
        f"(seed {seed}, round {figures.rounds}; the write in flight at the kill may or "
        "may not have committed, no other unacknowledged write)"
    )
    if sqlite:
        # First, the file as the dead process left it, before reactor touches it.
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], why
        conn.close()
    with _reactor_log() as logged, reactor.open(db, log_retention=RETENTION, timeout=10) as state:
        data, pairs, cache = state.scope("crash"), state.scope("crash-tx"), state.scope("crash-ttl")

        # The lease first: while its TTL runs, the crash did not release it. (It runs
        # until at least lock_try + LOCK_TTL; stats() read it before time.time().)
        if outcome.lock_state == "held":
            held = state.stats()["locks_held"]
            if time.time() < outcome.lock_try + LOCK_TTL:
                assert held == 1, f"a crash released a lease before its TTL {why}"
                figures.lease_checked_alive += 1

        stored = data.list()
        keys = {key for scope, key in model.values if scope == "crash"}
        assert set(stored) - {"counter", "doc"} <= keys, (
            f"keys nobody wrote: {sorted(set(stored) - keys - {'counter', 'doc'})[:10]} {why}"
        )
        for (scope, key), allowed in model.values.items():
            if scope != "crash":
                continue
            got = _stored(stored.get(key))
            assert got in allowed, (
                f"{key} holds {got!r}, acknowledged/in flight: "
                f"{sorted(v for v in allowed if v is not ABSENT)} {why}"
            )
        assert stored.get("counter", 0) in model.counter, (
            f"counter is {stored.get('counter')}, expected one of {sorted(model.counter)} {why}"
        )
        doc = stored.get("doc", {"n": 0, "last": None})
        assert (doc["n"], doc["last"]) in model.doc, (
            f"doc is {doc}, expected one of {sorted(model.doc, key=str)} {why}"
        )

        snapshot = pairs.snapshot().values  # one consistent read of the pairs and count
        count = snapshot.get("count", 0)
        assert count in model.tx_count, (
            f"transaction count {count}, expected one of {sorted(model.tx_count)} {why}"
        )
        for j in range(PAIRS):
            a, b = _stored(snapshot.get(f"a{j}")), _stored(snapshot.get(f"b{j}"))
            assert a == b, f"a torn transaction: a{j}={a!r}, b{j}={b!r} {why}"
            assert a in model.allowed("crash-tx", f"a{j}"), f"a{j}={a!r} {why}"
        fate = _fate(db, outcome, stored, snapshot, why)

        read_at = time.time()
        for key in cache.keys("*"):
            written = model.ttl_keys.get(key)
            assert written is not None, f"TTL key {key} nobody wrote {why}"
            assert written + KEY_TTL > read_at, (
                f"{key} readable {read_at - written:.3f} s after its write, TTL {KEY_TTL} {why}"
            )

        low, high, rows = raw_query(
            db, "SELECT MIN(revision), MAX(revision), COUNT(*) FROM reactor_changes"
        )[0]
        assert rows == 0 or high - low + 1 == rows, f"the change log has gaps {why}"

        # The lease: gone once its TTL has passed, and anyone can take it.
        if outcome.lock_state != "free":
            since = kill_time if outcome.lock_state == "acquiring" else outcome.lock_ack
            time.sleep(max(0.0, since + LOCK_TTL + 0.05 - time.time()))
        assert state.stats()["locks_held"] == 0, f"a lease outlived its TTL {why}"
        lock = state.lock("crash-lock", ttl=LOCK_TTL)
        assert lock.acquire(blocking=False), f"the lock cannot be taken after its TTL {why}"
        assert lock.token is not None
        assert lock.token > model.last_token, f"token {lock.token} after {model.last_token} {why}"
        model.last_token = lock.token
        lock.release()
    assert logged == [], f"reactor logged, after the crash: {logged[:5]} {why}"
    figures.verified += model.acked
    return fate


@contextmanager
def _reactor_log() -> Iterator[list[str]]:
    """What reactor logs at WARNING and above meanwhile (a repair would say so)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(f"{record.levelname}: {record.getMessage()}")

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("reactor")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _wait_ready(worker: subprocess.Popen[bytes], out: Path, seed: int) -> None:
    deadline = time.monotonic() + 30
    while not out.read_text().startswith("ready\n"):
        if worker.poll() is not None:
            pytest.fail(f"seed {seed}: the worker died before ready: {worker.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"seed {seed}: the worker was not ready within 30 s")
        time.sleep(0.01)


def _campaign(db: Any, tmp_path: Path, rounds: int, sqlite: bool) -> Figures:
    seed = int(os.environ.get("REACTOR_CRASH_SEED", random.randrange(10**9)))
    rng = random.Random(seed)
    model, figures = Model(), Figures()
    started = time.monotonic()
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    for _ in range(rounds):
        figures.rounds += 1
        round_seed = rng.randrange(10**9)
        with out.open("wb") as stdout, err.open("wb") as stderr:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WORKER,
                    str(db),
                    str(round_seed),
                    str(model.next_value + 1),
                    str(LOCK_TTL),
                    str(KEY_TTL),
                    str(POOL),
                    str(PAIRS),
                    str(RETENTION),
                ],
                stdout=stdout,
                stderr=stderr,
            )
        try:
            _wait_ready(worker, out, seed)
            time.sleep(rng.uniform(*KILL_AFTER))
            assert worker.poll() is None, (
                f"seed {seed}: the worker died on its own:\n{err.read_text()[-3000:]}"
            )
            os.kill(worker.pid, signal.SIGKILL)
            kill_time = time.time()
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=30)
        assert worker.returncode == -signal.SIGKILL, err.read_text()[-3000:]
        assert err.read_text() == "", f"seed {seed}: the worker complained:\n{err.read_text()}"
        if sqlite:
            wal = Path(f"{db}-wal")
            figures.largest_wal = max(
                figures.largest_wal, wal.stat().st_size if wal.exists() else 0
            )
        text = out.read_text()
        complete = text[: text.rfind("\n") + 1]  # a line cut by the kill was not written
        outcome = _apply(model, figures, complete.splitlines(), seed)
        if outcome.pending is not None:
            _in_flight(model, outcome.pending, kill_time)
        checking = time.monotonic()
        fate = _verify(db, model, outcome, kill_time, figures, seed, sqlite)
        figures.checking += time.monotonic() - checking
        if outcome.pending is not None:
            figures.in_flight[f"{outcome.pending[0]} {fate}"] += 1
        if outcome.lock_state in ("held", "releasing"):
            figures.killed_holding_lock += 1

    # Every TTL key written is expired exactly once, and swept from the table.
    with reactor.open(db, log_retention=RETENTION, timeout=10):
        deadline = time.monotonic() + 10
        while raw_query(db, "SELECT COUNT(*) FROM reactor_kv WHERE scope = 'crash-ttl'") != [(0,)]:
            assert time.monotonic() < deadline, f"seed {seed}: TTL keys not swept within 10 s"
            time.sleep(0.05)
    expired = dict(
        raw_query(
            db,
            "SELECT key, COUNT(*) FROM reactor_changes "
            "WHERE scope = 'crash-ttl' AND type = 'expired' GROUP BY key",
        )
    )
    assert all(n == 1 for n in expired.values()), (
        f"seed {seed}: keys expired twice: {[k for k, n in expired.items() if n > 1][:10]}"
    )
    assert model.ttl_acked <= set(expired), (
        f"seed {seed}: acknowledged TTL keys never expired: "
        f"{sorted(model.ttl_acked - set(expired))[:10]}"
    )
    assert set(expired) <= set(model.ttl_keys), f"seed {seed}: expired keys nobody wrote"
    figures.seconds = time.monotonic() - started
    print(f"\ncrash campaign (seed {seed}): {figures.report()}")
    return figures


def _sqlite(request: pytest.FixtureRequest) -> bool:
    return request.config.getoption("backend") != "postgresql"


def test_12_crash_rounds_lose_no_acknowledged_write(
    db_path: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sqlite = _sqlite(request)
    figures = _campaign(db_path, tmp_path, 12 if sqlite else 6, sqlite)
    assert sum(figures.acked.values()) > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_crash_campaign_200_rounds(
    db_path: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if "slow" not in request.config.getoption("markexpr"):
        pytest.skip("a long campaign: run it with -m slow")
    _campaign(db_path, tmp_path, 200, _sqlite(request))
