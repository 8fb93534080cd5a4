"""Tests of reactor's insides, on purpose: what no public call shows (the glob matcher's
SQL bounds, the order of the sweeper's chores, the runtime checks behind the public
``Literal`` types...). Every other test goes through the public API, ``reactor.testing``
and, to inject faults, ``tests.conftest.engine_of`` (see ``tests/README.md``)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import jsonpatch
import pytest
from hypothesis import given, settings
from rich.console import Console

import reactor
import reactor.aio
from reactor import ops
from reactor._backup import exchange as _exchange
from reactor._backup.exchange import Tally
from reactor._backup.export import ExportView
from reactor._base.keys import compile_pattern
from reactor._bench import writers
from reactor._bench.report import render
from reactor._bench.sqlite_peers import SQLiteFloorPeer
from reactor._engine import engine as _engine
from reactor._handles import registry as _registry
from reactor._storage import schema as _schema
from reactor._storage import sql_text as _sql
from reactor._storage import sqlite_file as _file
from reactor._storage.records import Row
from reactor._storage.sql_text import STREAMED_ROWS, TIMERS_DUE
from reactor._storage.sqlite_file import use_wal
from reactor._storage.txn import WriteTxn
from reactor._ui import server
from reactor._ui.app import TIMER_TEXT_MAX, TIMERS_MAX
from reactor._ui.changes import MAX_DIFF_CHARS, MAX_DIFF_OPS, diff
from reactor._ui.guard import allowed_hosts, host_refusal, is_loopback
from reactor._ui.health import problems
from reactor._ui.queue_routes import JOB_TEXT_MAX, QUEUES_MAX
from reactor._work import jobs as _jobs
from reactor._work import leases as _leases
from reactor._work import runs as _runs
from reactor._work import timers as _timers
from reactor._work import writes as _writes
from reactor.errors import BusyError, InvalidArgumentError, InvalidValueError
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import (
    CLI_ENV,
    backend,
    engine_of,
    held_elsewhere,
    raw_postgres,
    raw_query,
    run_reactor,
    wait_for,
)
from tests.conftest import wait_for as poll
from tests.test_bench import (
    REQUIRED,
    VERBS,
    assert_scaling,
    assert_workflow,
    bench,
    too_wide,
)
from tests.test_campaign_queues import _median_take
from tests.test_campaign_workflow import PATIENCE, _elsewhere
from tests.test_exchange import (
    _JOB,
    _OPS_TIMER,
    _TIMER,
    TOTAL,
    _check_whole,
    _fill,
    _fill_timers_and_queues,
    _good_lines,
    _job,
    _keys_only,
    _lines,
    _max_attempts,
    _nested,
    _timer,
    _took,
    _transfer,
)
from tests.test_files import _at_once, _reactor_database
from tests.test_files import _sqlite as _sqlite_file
from tests.test_keys import (
    ALL_MATCHES,
    ASCII_GLOB_ALPHABET,
    ASCII_KEY_ALPHABET,
    GLOB_ALPHABET,
    KEY_ALPHABET,
    NEAR_NON_ASCII_PREFIXES,
    globs,
    keys,
    reference_match,
)
from tests.test_lifecycle import JOIN, _join_all, _works
from tests.test_open import _raw_version, _sqlalchemy_url
from tests.test_readonly import WRITE_ONCE, _fingerprint, _seed, unwritable
from tests.test_timers import _refuse_key

Opener = Callable[..., reactor.State]


# -- the sweeper's chores one at a time (tests/test_model.py) --------------------------
def test_an_expiry_a_timer_meets_is_not_the_timers(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC section 13: a timer's write is applied "as an ordinary write (same result
    and event as if called then; ChangeEvent.timer carries the timer's id)". A user's
    write that meets a key past its deadline first records the key's expiry (timer
    None), and so does the sweeper when it gets there first; when the timer's write
    does it, the expiry carries the timer's id: a subscriber takes the key's expiry for
    the timer's doing, and the history depends on which thread came first. Found while
    modelling timers: the machine has the sweeper expire keys before it fires timers,
    and tolerates this case, which its thread can still bring about."""
    scope = state.scope("timers")
    scope.set("k", 1, ttl=1)
    timer = scope.schedule("k", 2, after=2)
    sweeper = engine_of(state).sweeper
    sweeper.close(5)  # its thread: the key must still be there, unswept, when it fires
    clock.advance(3)
    sweeper.fire_timers()
    for request in list(sweeper._firing.values()):
        request.result(timeout=5)
    got = [(e.type, e.new_value, e.timer) for e in scope.history("k")]
    assert got == [("created", 1, None), ("expired", None, None), ("created", 2, timer.id)]


# -- the public Literal types against their runtime checks (tests/test_api.py) ---------
def test_literal_types_are_the_values_checked_at_run_time() -> None:
    from reactor._engine.events import EVENT_TYPES
    from reactor._engine.options import DURABILITIES

    assert set(get_args(reactor.EventType)) == EVENT_TYPES
    assert get_args(reactor.Durability) == DURABILITIES == ("normal", "full", "memory")


def glob_matches(pattern: str, key: str) -> bool:
    """Whether the glob matcher matches ``key`` to ``pattern``, as ``keys()``, ``clear()``
    and subscriptions decide (after a prefix narrowed the rows): the matcher alone, for
    ``tests/test_redis_differential.py`` to hold it, as well as ``keys()``, to Redis."""
    return compile_pattern(pattern).matches(key)


# -- the glob matcher and its SQL bounds (tests/test_keys.py) --------------------------
@pytest.mark.parametrize(("pattern", "yes", "no"), ALL_MATCHES)
def test_glob_patterns_match_as_redis_keys_does_on_characters(
    pattern: str, yes: list[str], no: list[str]
) -> None:
    compiled = compile_pattern(pattern)
    for key in yes:
        assert compiled.matches(key), (pattern, key)
    for key in no:
        assert not compiled.matches(key), (pattern, key)


@settings(max_examples=2000, deadline=None)
@given(pattern=globs(ASCII_GLOB_ALPHABET), key=keys(ASCII_KEY_ALPHABET))
def test_on_ascii_globs_match_as_redis_does(pattern: str, key: str) -> None:
    assert compile_pattern(pattern).matches(key) == reference_match(pattern, key)


@settings(max_examples=2000, deadline=None)
@given(pattern=globs(GLOB_ALPHABET), key=keys(KEY_ALPHABET))
def test_globs_match_on_characters(pattern: str, key: str) -> None:
    assert compile_pattern(pattern).matches(key) == reference_match(pattern, key)


@pytest.mark.parametrize(
    ("pattern", "prefix", "exact"),
    [
        ("order-1", "order-1", True),
        ("o\\*1", "o*1", True),
        ("o-*", "o-", False),
        ("é?", "é", False),
        ("é", "é", True),
        ("\\é*", "é", False),  # the escape takes the whole character
        ("日本?", "日本", False),
        ("日\\*本*", "日*本", False),
        ("😀", "😀", True),
        ("a😀[b]", "a😀", False),
        ("a\ud800*", "a", False),  # a lone surrogate (no key holds one) ends the prefix
        ("a\ud800", "a", False),
        ("a\x00b*", "a", False),  # and so does a NUL, which PostgreSQL would refuse
        ("\\\ud800", "", False),
        ("[a]b", "", False),
        ("*", "", False),
    ],
)
def test_the_literal_prefix_is_whole_characters(pattern: str, prefix: str, exact: bool) -> None:
    compiled = compile_pattern(pattern)
    assert (compiled.prefix, compiled.exact) == (prefix, exact)
    assert (compiled.bounds() or ("",))[0] == prefix


@pytest.mark.parametrize(
    ("pattern", "bounds"),
    [
        ("é*", ("é", "ê")),
        ("é?", ("é", "ê")),
        ("日本*", ("日本", "日札")),  # 本 is U+672C, 札 U+672D
        ("😀[a]", ("😀", "😁")),
        ("a\U0010ffff*", ("a\U0010ffff", "b")),
        ("\U0010ffff\U0010ffff?", ("\U0010ffff\U0010ffff", None)),
        ("\ud7ff?", ("\ud7ff", "\ue000")),  # the successor skips the surrogates
        ("[é]*", None),
    ],
)
def test_bounds_of_non_ascii_prefixes(pattern: str, bounds: tuple[str, str | None]) -> None:
    assert compile_pattern(pattern).bounds() == bounds


@pytest.mark.parametrize(
    "pattern",
    ["é*", "é?", "\\é[a-z]", "é[^a]*", "日本*", "日本?", "日?", "😀*", "\U0010ffff*", "[é日]*"],
)
def test_the_store_narrows_to_non_ascii_prefixes(state: reactor.State, pattern: str) -> None:
    # The store reads the keys between the bounds of the literal prefix (SQLite's and
    # PostgreSQL's "C" order of keys is by code point, as Python's), the matcher the rest.
    scope = state.scope("s")
    scope.set_many(dict.fromkeys(NEAR_NON_ASCII_PREFIXES, 1))
    compiled = compile_pattern(pattern)
    expected = sorted(key for key in NEAR_NON_ASCII_PREFIXES if compiled.matches(key))
    assert expected
    assert scope.keys(pattern) == expected
    assert scope.clear(pattern) == len(expected)
    assert scope.keys() == sorted(set(NEAR_NON_ASCII_PREFIXES) - set(expected))


def test_a_pattern_with_a_lone_surrogate_or_nul_matches_no_key(state: reactor.State) -> None:
    # No key holds either (check_key), and neither may reach SQL as a bound: PostgreSQL
    # refuses a NUL in text, and a lone surrogate cannot be encoded.
    scope = state.scope("s")
    scope.set_many({"a": 1, "ab": 2, "a\ufffd": 3, "\ud7ff": 4, "\ue000": 5})
    for pattern in ["a\ud800*", "a\ud800", "\ud800", "a\x00*", "a\x00", "\x00*", "?\x00"]:
        assert scope.keys(pattern) == [], repr(pattern)
        assert scope.clear(pattern) == 0, repr(pattern)
        assert not compile_pattern(pattern).matches("a"), repr(pattern)
    assert scope.keys("a*") == ["a", "ab", "a\ufffd"]
    # In a class, a surrogate is one member among others, which still match.
    assert scope.keys("[\ud800a]") == ["a"]
    assert scope.keys("[\ud7ff-\ue000]") == ["\ud7ff", "\ue000"]
    assert scope.keys("[^\ud800]") == ["a", "\ud7ff", "\ue000"]


def test_wide_classes_compile_and_match_quickly() -> None:
    # A class is ranges of code points, never a set of them: "[^a]" holds 1,114,111.
    # Timed in CPU (process time), which a loaded machine's stalls do not stretch.
    patterns = [f"[^{chr(0x4E00 + i)}]*[\x01-\U0010ffff][!0-9]" for i in range(200)]
    started = time.process_time()
    for pattern in patterns:
        compiled = compile_pattern(pattern)
        assert compiled.matches("日本語")
        assert not compiled.matches(chr(0x4E00 + 200) + "x")
    assert time.process_time() - started < 5  # about 30 ms


def test_abusive_patterns_match_in_linear_time() -> None:
    key = "a" * 1024
    for pattern in ["*a*a*a*a*a*a*a*b", "*a?*a[a-b]*a*" * 40 + "b", "*" + "?*" * 500 + "b"]:
        compiled = compile_pattern(pattern)
        started = time.process_time()
        for _ in range(10):
            assert not compiled.matches(key)
        # Under a millisecond of CPU (process time: a loaded machine's stalls do not
        # count); backtracking would take far longer.
        assert time.process_time() - started < 2, pattern
    key = "é" * 1024
    for pattern in ["*é*é*é*é*é*é*é*b", "*é?*é[β-ω]*[^a]*" * 40 + "b", "*" + "?*" * 500 + "日"]:
        compiled = compile_pattern(pattern)
        started = time.process_time()
        for _ in range(10):
            assert not compiled.matches(key)
        # Under a millisecond of CPU (process time: a loaded machine's stalls do not
        # count); backtracking would take far longer.
        assert time.process_time() - started < 2, pattern


# -- the schema's versions (tests/test_open.py, tests/test_versions.py) ----------------
def test_a_new_database_has_the_current_schema_version(open_state: Opener, db_path: Path) -> None:
    open_state()
    assert _raw_version(db_path) == _schema.SCHEMA_VERSION


def test_an_older_database_is_migrated(db_path: Any) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(_sqlalchemy_url(db_path))
    assert _schema.migrate(engine, target=1) == 0  # a database as version 1 left it
    with engine.begin() as conn:
        conn.execute(_schema.kv.insert().values(scope="s", key="k", value="41", revision=0))
        assert not sa.inspect(conn).has_table("reactor_changes")
    engine.dispose()

    with reactor.open(db_path) as state:
        assert state.scope("s").increment("k") == 42
    assert _raw_version(db_path) == _schema.SCHEMA_VERSION
    logged = raw_query(db_path, "SELECT key, type, new_value FROM reactor_changes")
    assert logged == [("k", "updated", "42")]


def test_a_version_4_database_gets_versions(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from reactor._storage import schema as _schema

    path = tmp_path / "v4.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    _schema.migrate(engine, target=4)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO reactor_changes (revision, scope, key, type, old_value, new_value, "
            "timestamp) VALUES (1, 's', 'k', 'created', NULL, '1', 0), "
            "(2, 's', 'k', 'updated', '1', '2', 0)"
        )
        conn.exec_driver_sql(
            "INSERT INTO reactor_kv (scope, key, value, expires_at, revision) "
            "VALUES ('s', 'k', '2', NULL, 2)"
        )
    engine.dispose()
    with reactor.open(path) as state:
        scope = state.scope("s")
        assert scope.entry("k") == reactor.Entry(2, 2, 2, 1, None)
        assert [e.version for e in scope.history("k")] == [None, None]
        scope.increment("k")
        assert scope.entry("k") == reactor.Entry(3, 3, 2, 2, None)
        assert scope.history("k")[-1].version == 2
        assert scope.get("k", at_revision=1) == 1


# -- one chore alone; races inside wait_for and a replay (test_campaign_workflow, test_aio) ---
def test_at_revision_at_the_compaction_horizon_after_a_deadline(
    open_state: Opener, clock: ManualClock
) -> None:
    """SPEC §3 and §13, as above: the oldest revision still readable is R = the
    compaction horizon; a key past its deadline at R must read as absent."""
    state = open_state(clock=clock, log_retention=2)
    ttl_scope, other = state.scope("ttl"), state.scope("other")
    ttl_scope.set("k", "v", ttl=10)
    with ttl_scope.transaction():  # the sweeper cannot record k's expiry meanwhile
        clock.advance(20)
        for n in range(5):
            other.set("x", n)
        engine_of(state).sweeper.compact()  # only: expiring k would wait for the body
        horizon = engine_of(state).store.compacted()
        assert horizon > 1
        assert _elsewhere(lambda: ttl_scope.get("k", "gone")) == "gone"
        # Read from another thread while the key's expiry is still unrecorded.
        assert _elsewhere(lambda: ttl_scope.get("k", "gone", at_revision=horizon)) == "gone"


def test_a_write_then_close_racing_a_waiter_always_returns_the_value(
    db_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """waiting.md: 'Changes committed before the close are delivered first: a wait they
    satisfy returns their value.' The waiter thread is made to lose the CPU right after
    it found nothing new (``Waiter.match`` returning None), which any thread switch can
    do; meanwhile a satisfying write commits and the engine closes."""
    from reactor._handles import waiting as _waiting

    original = _waiting.Waiter.match
    slow = threading.Event()
    looked = threading.Event()

    def match(self: Any, predicate: Any) -> Any:
        found = original(self, predicate)
        if found is None and slow.is_set():
            looked.set()
            time.sleep(0.3)  # preempted here
        return found

    monkeypatch.setattr(_waiting.Waiter, "match", match)
    state = reactor.open(db_path)
    scope = state.scope("w")
    scope.set("k", "wait")
    outcome: list[Any] = []

    def waiter() -> None:
        try:
            outcome.append(scope.wait_for("k", lambda v: v == "go", timeout=PATIENCE))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        poll(engine_of(state).hub.listeners)  # the waiter listens
        slow.set()
        scope.set("k", "not yet")  # wakes the waiter: it looks, finds nothing, is preempted
        assert looked.wait(PATIENCE)
        scope.set("k", "go")
        state.close()
        thread.join(PATIENCE)
    finally:
        state.close()
    assert outcome == ["go"]


async def test_a_replay_that_fails_gives_what_it_read_then_the_error_and_ends(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read a page at a time in a worker, a replay overtaken by compaction (say) still
    yields the events read before the error, then raises it, and the watch ends."""
    from reactor._handles import subscriptions as _subscriptions

    async with reactor.aio.open(db_path) as state:
        await state.scope("s").set_many({"a": 1, "b": 2, "c": 3})
        replay = _subscriptions._Feed.replay

        def failing(self: _subscriptions._Feed) -> Iterator[reactor.ChangeEvent]:
            for i, event in enumerate(replay(self)):
                if i == 2:
                    raise reactor.RevisionCompactedError("compacted meanwhile")
                yield event

        monkeypatch.setattr(_subscriptions._Feed, "replay", failing)
        watch = state.watch(since=0, scope="s")
        keys: list[str] = []
        with pytest.raises(reactor.RevisionCompactedError):
            async for event in watch:
                keys.append(event.key)  # noqa: PERF401 - the loop is what is tested
        assert len(keys) == 2
        with pytest.raises(StopAsyncIteration):
            await watch.__anext__()


# -- the registry's close races (tests/test_lifecycle.py) ------------------------------
def test_open_while_the_last_handle_is_closing_returns_a_working_handle(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last handle's close() is held up as it starts; an open() meanwhile must not
    join the engine that is going away (before the fix it did, and got a dead handle)."""
    real_close = _engine.Engine.close
    closing = threading.Event()

    def held_up_close(engine: _engine.Engine) -> None:
        closing.set()
        time.sleep(0.2)  # the racing open() runs now
        real_close(engine)

    monkeypatch.setattr(_engine.Engine, "close", held_up_close)
    first = reactor.open(target)
    _works(first)
    closer = threading.Thread(target=first.close, name="closer")
    closer.start()
    assert closing.wait(JOIN)
    second = reactor.open(target)
    try:
        _join_all([closer])
        _works(second)  # after the first handle's close() has finished
        assert first.closed
        with pytest.raises(reactor.ClosedError):
            first.scope("lifecycle").get("probe")
    finally:
        second.close()


def test_open_after_the_engine_is_marked_closed_but_not_yet_forgotten(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between an engine marking itself closed and leaving the registry, an open()
    found it there and raised ClosedError (before the fix)."""
    real_forget = _registry._forget
    forgetting = threading.Event()

    def held_up_forget(engine: _engine.Engine) -> None:
        forgetting.set()
        time.sleep(0.2)
        real_forget(engine)

    monkeypatch.setattr(_registry, "_forget", held_up_forget)
    first = reactor.open(target)
    closer = threading.Thread(target=first.close, name="closer")
    closer.start()
    assert forgetting.wait(JOIN)
    second = reactor.open(target)
    try:
        _works(second)
    finally:
        second.close()
        _join_all([closer])


# -- queues: query plans, the sweeper's look (tests/test_campaign_queues.py) -----------
def _plans(config: pytest.Config, db: Any) -> list[str]:
    """The plans of the statements a take, a wait, the sweeper and stats run, on a
    queue called "big" (SQLite: EXPLAIN QUERY PLAN's details; PostgreSQL: EXPLAIN)."""
    now = time.time()
    full = ("big", now, "big", now, 1)
    statements = [
        (_sql.FIRST_READY, ("big", now)),
        (_sql.FIRST_PRIORITY, ("big", now)),
        (_sql.FIRST_READY_NOT_FULL, full),
        (_sql.FIRST_PRIORITY_NOT_FULL, full),
        (_sql.NEXT_TIMES, ("big", "big")),
        (_sql.NEXT_TIMES_AFTER, ("big", now, "big", now)),
        (_sql.TAKEN_COUNT, ("big", now)),
        (_sql.TAKEN_BY_GROUP, ("big", now)),
        (_sql.NTH_LAST_TAKE, ("big", 9)),
        (_sql.TAKES_SINCE, ("big", now)),
        (_sql.DUE_JOBS, ("big", "taken", now, 1000)),
        (_sql.LATER_JOBS, ("big", "ready", now, 1000)),
        (_sql.JOBS_IN_STATE, ("big", "dead", 1000)),
        (_sql.QUEUES_DUE, (now,)),
        (_sql.FIRST_LEASE_END, ()),  # the health check's: one seek a queue
        (_sql.JOB, ("big", 5)),
        (_sql.JOB_INFO, ("big", 5)),
        (_sql.JOBS_BY_KEY.format("?"), ("big", "some key")),
        (_sql.SET_JOB, ("taken", now, 1, "token", None, None, "big", 5)),
    ]
    plans = []
    for sql, params in statements:
        if backend(config) == "postgresql":
            from reactor._storage.postgres_text import pg as _pg  # names as the indexes hold them

            rows = raw_query(db, "EXPLAIN " + _pg(sql), params)
            plans.append("\n".join(str(row[0]) for row in rows))
        else:
            rows = raw_query(db, "EXPLAIN QUERY PLAN " + sql, params)
            plans.append("\n".join(str(row[-1]) for row in rows))
    return plans


def test_a_queue_of_100000_jobs_takes_in_log_time(
    open_state: Callable[..., reactor.State], db_path: Any, request: pytest.FixtureRequest
) -> None:
    state = open_state()
    started = time.monotonic()
    for batch in range(10):
        with state.scope("load").transaction() as tx:
            for n in range(10_000):
                tx.enqueue("big", batch * 10_000 + n)
    loaded = time.monotonic() - started
    big, small = state.queue("big"), state.queue("small")
    for n in range(10):
        small.put(n)
    assert big.stats() == {
        "ready": 100_000,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    for plan in _plans(request.config, db_path):
        indexes = ("reactor_jobs_ready", "reactor_jobs_key", "reactor_jobs_pkey", "reactor_jobs_id")
        indexes += ("reactor_jobs_priority", "reactor_takes_at", "autoindex")
        assert any(index in plan for index in indexes), plan
        assert "SCAN reactor_jobs" not in plan, plan  # SQLite: a full scan
        assert "Seq Scan on reactor_jobs" not in plan, plan  # PostgreSQL: the same
        assert "SCAN reactor_takes" not in plan, plan
        assert "Seq Scan on reactor_takes" not in plan, plan
        # No sort of the jobs found, but the grouping of the taken ones by group.
        grouping = "grp" in plan or "GROUP BY" in plan
        assert grouping or "Sort" not in plan, plan  # PostgreSQL
        assert "TEMP B-TREE" not in plan.replace("TEMP B-TREE FOR GROUP BY", ""), plan
    _median_take(small)  # warm both up
    _median_take(big)
    on_big, on_small = _median_take(big), _median_take(small)
    # Loose: as fast as on a queue of ten, give or take a loaded machine.
    assert on_big < 5 * on_small + 0.05, (on_big, on_small)
    first = big.take(timeout=0)
    assert first is not None
    assert first.item == 30  # 0-29 were taken and nacked: in line again, behind the rest
    assert loaded < 120
    print(f"100,000 jobs in {loaded:.1f} s; take {on_big * 1e3:.2f} vs {on_small * 1e3:.2f} ms")


def test_stats_and_the_sweeper_look_stay_cheap_on_a_big_queue(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state()
    with state.scope("load").transaction() as tx:
        for n in range(20_000):
            tx.enqueue("big", n, delay=n % 2 * 60)
    queue = state.queue("big")
    started = time.process_time()
    assert queue.stats() == {
        "ready": 10_000,
        "delayed": 10_000,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert time.process_time() - started < 5
    from tests.conftest import engine_of

    engine = engine_of(state)
    started = time.process_time()
    assert _leases.expire_leases(engine) == 0
    assert time.process_time() - started < 1


# -- timers: periods, the due index, refused writes (tests/test_timers.py) -------------
def test_next_due_skips_missed_periods() -> None:
    assert _timers.next_due(100.0, 10.0, 100.0) == 110.0
    assert _timers.next_due(100.0, 10.0, 105.0) == 110.0
    assert _timers.next_due(100.0, 10.0, 110.0) == 120.0
    assert _timers.next_due(100.0, 10.0, 1000.5) == 1010.0
    assert _timers.next_due(100.0, 10.0, 50.0) == 110.0


def test_finding_due_timers_uses_the_index(db_path: Any, open_state: Callable[..., Any]) -> None:
    """100,000 pending timers: finding the due ones reads the index, not the table."""
    state = open_state()
    rows = [(f"t{n:06d}", "s", f"k{n}", 1e10 + n, None, "1", None, 0.0) for n in range(100_000)]
    if str(db_path).startswith("postgresql"):
        import psycopg
        import sqlalchemy as sa

        url = sa.make_url(str(db_path)).set(drivername="postgresql")
        options = url.query.get("options")
        with psycopg.connect(
            url.set(query={}).render_as_string(hide_password=False), options=options
        ) as conn:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO reactor_timers (id, scope, key, due, every, value, ops, "
                    "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )
            conn.execute("ANALYZE reactor_timers")
        plan = raw_query(
            db_path, "EXPLAIN " + TIMERS_DUE + " ORDER BY due, id LIMIT ?", (time.time(), 1000)
        )
        text = " ".join(str(row[0]) for row in plan)
        assert "reactor_timers_due" in text, text
        assert "Seq Scan" not in text, text
    else:
        import sqlite3

        with sqlite3.connect(db_path) as conn:
            conn.executemany(
                "INSERT INTO reactor_timers (id, scope, key, due, every, value, ops, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        conn.close()
        plan = raw_query(
            db_path,
            "EXPLAIN QUERY PLAN " + TIMERS_DUE + " ORDER BY due, id LIMIT ?",
            (time.time(), 1000),
        )
        text = " ".join(str(row[-1]) for row in plan)
        assert "USING INDEX reactor_timers_due" in text or "USING COVERING INDEX" in text, text
    assert state.stats()["timers"]["pending"] == 100_000
    assert engine_of(state).store.due_timers(time.time(), 1000) == []


def test_a_timer_whose_write_the_database_refuses_is_dropped_alone(
    state: reactor.State, clock: ManualClock, db_path: Any
) -> None:
    """SPEC §13: a timer whose write fails is counted and dropped (a recurring one
    fires again next period). A write the database itself refused used to fail the
    whole request, so the timer stayed due for ever, retried four times a second, and
    with it the other timers of its request and the writes committed with them."""
    _refuse_key(db_path, "refused")
    scope = state.scope("s")
    with pytest.raises(reactor.StorageError, match="no row for this key"):
        scope.set("refused", 1)
    start = clock.time()
    fine = [scope.schedule(f"k{n}", n, after=1) for n in range(6)]
    scope.schedule("refused", "once", after=1)
    recurring = scope.schedule("refused", ops=[ops.increment("")], every=10)
    elsewhere = state.scope("t").schedule("k", "elsewhere", after=1)
    engine = engine_of(state)
    mailbox = engine._mailbox("s")
    with held_elsewhere(
        mailbox._running
    ):  # the actor waits: what is queued meanwhile comes in one batch
        clock.advance(11)
        plain = engine.submit(
            "s", _writes.set_value(engine.options, "s", "plain", "written", None, False)
        )
        engine.sweeper.fire_timers()  # (or its thread did it: queued all the same)
    assert plain.result(timeout=10) == reactor.Change(None, "written")  # not failed with it
    # Scope t's timer fires in a batch of its own, maybe after s's failures are counted.
    expected = {"pending": 1, "fired": 9, "failed": 2}
    wait_for(lambda: state.stats()["timers"] == expected, timeout=10)
    assert [scope.get(timer.key) for timer in fine] == list(range(6))
    assert state.scope("t").get("k") == "elsewhere"
    assert scope.get("refused") is None
    (pending,) = state.timers()
    assert (pending.id, pending.due) == (recurring.id, start + 20)  # its next period
    fired = {e.timer for e in state.changes()}
    assert {timer.id for timer in fine} | {elsewhere.id} <= fired
    clock.advance(10)  # the next period fires (and is refused, and dropped, again)
    wait_for(lambda: state.stats()["timers"]["failed"] == 3, timeout=10)
    assert [(t.id, t.due) for t in state.timers()] == [(recurring.id, start + 30)]
    assert scope.set("after", 1) == reactor.Change(None, 1)  # the scope goes on


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        ("sqlite3.IntegrityError('CHECK constraint failed')", True),
        ("sqlite3.DataError('string or blob too big')", True),
        ("sqlite3.OperationalError('disk I/O error')", False),
        ("sqlite3.OperationalError('database is locked')", False),
        ("psycopg.errors.CheckViolation('refused')", True),
        ("psycopg.errors.ProgramLimitExceeded('index row size exceeds maximum')", True),
        ("psycopg.errors.RaiseException('a trigger said no')", True),
        ("psycopg.errors.AdminShutdown('terminating connection')", False),
        ("psycopg.OperationalError('server closed the connection unexpectedly')", False),
        ("psycopg.errors.DiskFull('could not extend file')", False),
        ("psycopg.errors.SerializationFailure('could not serialize')", False),
    ],
)
def test_a_refused_write_is_told_from_a_failed_database(error: str, refused: bool) -> None:
    import sqlite3

    import psycopg

    from reactor._storage import postgres_statements as _postgres
    from reactor._storage import sqlite_statements as _sqlite
    from reactor._storage.records import RefusedError

    exc = eval(error, {"sqlite3": sqlite3, "psycopg": psycopg})  # noqa: S307 - the table above
    translate = _sqlite.translate if error.startswith("sqlite3") else _postgres.translate
    translated = translate(exc, "/srv/state.db")
    assert isinstance(translated, reactor.StorageError)
    assert isinstance(translated, RefusedError) is refused
    assert str(translated).startswith("the database /srv/state.db ")


# -- SQLite's probe and snapshot; older schemas (test_startup, test_readonly) ----------
@pytest.mark.sqlite_only("SQLite's schema check")
def test_a_file_changed_after_the_probe_is_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version the read-only probe saw is read again under the write lock: a file
    that was emptied in between (here: a probe that says "current" of a new file) gets
    its schema, with SQLAlchemy, as any new file does."""
    monkeypatch.setattr(_file, "probe", lambda *_: _schema.SCHEMA_VERSION)
    with reactor.open(tmp_path / "state.db") as state:
        state.scope("s").set("k", 1)
        assert state.scope("s").get("k") == 1


@pytest.mark.sqlite_only("SQLite's immutable snapshots")
def test_a_snapshot_is_given_up_once_the_file_has_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nobody to notice the writer while it had the database open (no follower
    here), its -wal and -shm are gone by the next read: the database file itself has
    changed, and that is enough for the read to give up its snapshot."""
    from reactor._storage.sqlite import SQLiteStore

    monkeypatch.setattr(SQLiteStore, "await_commits", lambda _, timeout: time.sleep(timeout))
    db = tmp_path / "state.db"
    _seed(db)
    with reactor.open(db, readonly=True) as state:
        assert state.scope("s").get("late") is None
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(WRITE_ONCE), str(db), "1"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=CLI_ENV,
        )
        assert done.returncode == 0, done.stderr
        assert sorted(path.name for path in tmp_path.iterdir()) == ["state.db"]
        assert state.scope("s").get("late") == 1


@pytest.mark.sqlite_only("SQLite files that need a write before they can be read")
def test_what_needs_a_write_first_is_refused_and_left_untouched(tmp_path: Path) -> None:
    import sqlalchemy as sa

    empty = tmp_path / "empty.db"
    empty.touch()
    older = tmp_path / "older.db"
    engine = sa.create_engine(f"sqlite:///{older}")
    _schema.migrate(engine, target=_schema.SCHEMA_VERSION - 1)
    engine.dispose()
    newer = tmp_path / "newer.db"
    _seed(newer)
    raw_query(newer, "UPDATE reactor_meta SET value = 99 WHERE name = 'schema_version'")
    other = tmp_path / "other.db"
    raw_query(other, "CREATE TABLE t (a)")
    before = _fingerprint(tmp_path)
    for path, error, match in [
        (empty, reactor.ReadOnlyError, "no reactor database yet"),
        (older, reactor.ReadOnlyError, "older reactor"),
        (newer, reactor.SchemaError, "99"),
        (other, reactor.StorageError, "not a reactor database"),
        (tmp_path, reactor.StorageError, "not a database file"),
    ]:
        with pytest.raises(error, match=match):
            reactor.open(path, readonly=True)
    assert _fingerprint(tmp_path) == before


@pytest.mark.sqlite_only("SQLite schema versions")
def test_a_reading_command_still_migrates_an_older_database_it_may_write(
    tmp_path: Path,
) -> None:
    """A database of an older reactor cannot be read before it is migrated, which
    writes: a reading command does it where it may (as it always did), and says why it
    cannot where it may not."""
    import sqlalchemy as sa

    folder = tmp_path / "data"
    folder.mkdir()
    older = folder / "older.db"
    engine = sa.create_engine(f"sqlite:///{older}")
    _schema.migrate(engine, target=_schema.SCHEMA_VERSION - 1)
    engine.dispose()
    with unwritable(folder):
        done = run_reactor("--db", str(older), "keys", "s", cwd=tmp_path)
    assert done.returncode == 3  # storage
    assert "older reactor" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_reactor("--db", str(older), "keys", "s", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
    version = "SELECT value FROM reactor_meta WHERE name = 'schema_version'"
    assert raw_query(older, version) == [(_schema.SCHEMA_VERSION,)]


# -- SQLite's files (tests/test_files.py) --------------------------------------------
@pytest.mark.sqlite_only("database files")
def test_a_version_check_that_another_connection_overtook_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no WAL there, the check reads the database file alone (no lock): when
    another connection opens the database meanwhile, what it read may be torn, so it
    reads again, through the WAL, rather than refuse a good database."""
    from reactor._storage import sqlite_file as _sqlite

    path = tmp_path / "state.db"
    _reactor_database(path)
    read = _sqlite.read_version
    others: list[sqlite3.Connection] = []

    def overtaken(at: Path, conn: sqlite3.Connection) -> int | None:
        if not others:  # the first read: another connection opens it, and commits
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("UPDATE reactor_kv SET value = '\"other\"'")
            others.append(other)
            raise reactor.StorageError("the database failed: database disk image is malformed")
        return read(at, conn)

    monkeypatch.setattr(_sqlite, "read_version", overtaken)
    try:
        assert _sqlite.probe(path, 5.0) == _schema.SCHEMA_VERSION
    finally:
        for other in others:
            other.close()
    monkeypatch.undo()
    with reactor.open(path) as state:
        assert state.scope("s").get("k") == "other"


@pytest.mark.sqlite_only("database files")
def test_databases_of_every_older_version_still_open(tmp_path: Path) -> None:
    import sqlalchemy as sa

    for version in range(1, _schema.SCHEMA_VERSION):
        path = tmp_path / f"v{version}.db"
        engine = sa.create_engine(f"sqlite:///{path}")
        _schema.migrate(engine, target=version)
        engine.dispose()
        with reactor.open(path) as state:
            assert state.scope("s").increment("n") == 1


@pytest.mark.sqlite_only("database files")
def test_processes_creating_one_new_database_at_once(tmp_path: Path) -> None:
    path = tmp_path / "new" / "state.db"
    _at_once(path, 4)
    with reactor.open(path) as state:
        assert state.scope("s").get("opened") == 4
        assert sorted(state.scope("s").keys("p*")) == [f"p{i}" for i in range(4)]
    version = sqlite3.connect(path).execute(
        "SELECT value FROM reactor_meta WHERE name = 'schema_version'"
    )
    assert version.fetchall() == [(_schema.SCHEMA_VERSION,)]


@pytest.mark.sqlite_only("database files")
def test_processes_migrating_one_old_database_at_once(tmp_path: Path) -> None:
    import sqlalchemy as sa

    path = tmp_path / "state.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    _schema.migrate(engine, target=1)
    with engine.begin() as conn:
        conn.execute(_schema.kv.insert().values(scope="s", key="opened", value="0", revision=0))
    engine.dispose()
    _at_once(path, 4)
    with reactor.open(path) as state:
        assert state.scope("s").get("opened") == 4


@pytest.mark.sqlite_only("database files")
def test_connections_switching_a_new_file_to_wal_together_all_succeed(tmp_path: Path) -> None:
    # Raw sqlite3 fails here about one round in ten ("database is locked" at once, the
    # busy handler skipped); use_wal retries within the timeout.

    failures: list[BaseException] = []
    for round_ in range(60):
        path = tmp_path / f"r{round_}.db"
        _sqlite_file(path, "CREATE TABLE t (x)")
        start = threading.Barrier(4)

        def switch(path: Path = path, start: threading.Barrier = start) -> None:
            conn = sqlite3.connect(path, timeout=5, isolation_level=None)
            try:
                start.wait(timeout=10)
                use_wal(conn, 5.0)
                assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            except BaseException as exc:  # collected for the assertion
                failures.append(exc)
            finally:
                conn.close()

        threads = [threading.Thread(target=switch) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert failures == []


# -- the benchmark's writers and report (tests/test_bench.py) ----------------------------
def rendered(result: dict[str, Any]) -> list[str]:
    """The result's tables as an 80-column terminal shows them."""
    console = Console(width=80, record=True, force_terminal=True, file=io.StringIO())
    render(result, console)
    return console.export_text().splitlines()


def test_the_floor_peer_logs_each_write_in_its_transaction(tmp_path: Path) -> None:
    """``sqlite3+log``, the floor of reactor's guarantees in bare sqlite3: a change
    record for each write that changed something, numbered, with the row's version."""
    peer = SQLiteFloorPeer(str(tmp_path))
    try:
        peer.set("a", {"x": 1})
        peer.set("a", {"x": 2})
        assert [peer.increment("n"), peer.increment("n")] == [1, 2]
        peer.delete("a")
        peer.delete("absent")  # nothing to delete: no record
        assert peer.get("a") is None
        assert peer.count("n") == 2
    finally:
        peer.close()
    with sqlite3.connect(tmp_path / "sqlite3.db") as conn:
        log = conn.execute("SELECT revision, k, type, version FROM floor_log").fetchall()
    conn.close()
    assert log == [
        (1, "a", "created", 1),
        (2, "a", "updated", 2),
        (3, "n", "created", 1),
        (4, "n", "updated", 2),
        (5, "a", "deleted", 3),
    ]


@pytest.mark.timeout(200)
def test_quick_bench_on_a_terminal_fits_80_columns(tmp_path: Path) -> None:
    pytest.importorskip("diskcache")
    done = bench(
        "bench", "--quick", "--table", "--output", "out.json", "--db-dir", "dbs", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "reactor on SQLite against its peers" in done.stdout
    assert "how writes scale: reactor on SQLite" in done.stdout
    assert too_wide(lines) == []
    result = json.loads((tmp_path / "out.json").read_text())
    figures = result["figures"]
    for peer in REQUIRED:
        assert peer in figures, (peer, result["skipped"], result["errors"])
        for mode in ("1t", "4t"):
            for verb in VERBS:
                assert figures[peer][mode][verb]["ops_per_s"] > 0, (peer, mode, verb)
    for verb in VERBS:
        assert figures["reactor"]["1p"][verb]["ops_per_s"] > 0
        assert figures["reactor"]["aio100"][verb]["ops_per_s"] > 0
    assert figures["reactor"]["4t"]["increment"]["count_exact"] is True
    assert "work per operation" in done.stdout
    for peer in REQUIRED:  # counted in one thread, every peer
        for verb in VERBS:
            assert figures[peer]["1t"][verb]["calls_per_op"] >= 1, (peer, verb)
    for mode in ("1t", "4t", "aio100"):  # reactor's own, beside each write phase
        assert "writes_per_transaction" not in figures["reactor"][mode]["get"]
        for verb in ("set", "update", "increment", "delete"):
            shared = figures["reactor"][mode][verb]["writes_per_transaction"]
            # One thread's writes each commit alone (the upkeep may commit beside them).
            assert 0.5 <= shared <= 1.0 if mode == "1t" else shared >= 0.5, (mode, verb)
    assert "writes_per_transaction" not in figures["reactor"]["4p"]["set"]
    assert "calls_per_op" not in figures["reactor"]["4t"]["set"]
    for verb in VERBS:  # counted on the event loop's thread, 100 tasks at once
        assert figures["reactor"]["aio100"][verb]["loop_calls_per_op"] >= 1, verb
    assert result["events"]["in_process"]["delivered"] > 0
    assert result["machine"]["sqlite"]
    section = assert_scaling(result, "sqlite")
    assert "pgbench" not in section, "pgbench runs beside PostgreSQL only"
    assert too_wide(rendered(result)) == []
    assert list((tmp_path / "dbs").iterdir()) == [], "bench leaves no file behind"
    assert_workflow(result)


def full_section(*, pgbench: bool) -> dict[str, Any]:
    """A writers section as the full plan makes it, with made-up figures."""
    plan = writers.plan_for(quick=False, rounds=3)
    measured: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for processes, threads in plan.cells():
        for layout in writers.LAYOUTS:
            figure = {"ops_per_s": 123_456.0 * threads, "p50_us": 1234.5, "p99_us": 98_765.0}
            measured[processes, threads, layout] = [figure, figure, figure]
    section = writers.summarize(measured, plan.cells())
    section["settings"] = {"rounds": 3, "seconds_per_cell": 2.0, "cells": plan.cells()}
    if pgbench:
        section["pgbench"] = {
            "available": True,
            "clients": {str(n): {"tps": 1500.0 * n, "latency_ms": 0.7} for n in plan.clients()},
        }
        writers.beside_pgbench(section)
    section["targets"] = writers.writer_targets(section, "postgresql" if pgbench else "sqlite")
    return section


def test_full_writers_table_fits_80_columns() -> None:
    section = full_section(pgbench=True)
    result = {
        "scaling": {"postgresql": section},
        "skipped": {},
        "peers": {},
        "notes": [],
        "machine": {"platform": "Linux", "cpu_count": 2, "python": "CPython", "sqlite": "3"},
        "seconds": 1.0,
    }
    lines = rendered(result)
    assert too_wide(lines) == []
    text = "\n".join(lines)
    for label in ("1p x 8t", "8p x 1t", "4p x 4t", "pgbench", "÷pgb"):
        assert label in text
    assert "not measured" not in text, "the full plan measures every target"


def test_writer_targets_per_backend() -> None:
    on_pg = {t["target"]: t for t in full_section(pgbench=True)["targets"]}
    assert set(on_pg) == {
        "1 process >= 0.8x pgbench -N -c1",
        "1 process x 4 threads >= 2.5x one thread",
        "4 processes >= 1.0x one process",
        "4 processes x 4 threads >= 1.0x pgbench -N -c4",
    }
    # made-up figures: writes/s grow with threads, not with processes
    assert on_pg["1 process x 4 threads >= 2.5x one thread"]["measured"] == pytest.approx(4.0)
    assert on_pg["4 processes >= 1.0x one process"]["ok"] is True
    assert on_pg["4 processes x 4 threads >= 1.0x pgbench -N -c4"]["measured"] == pytest.approx(
        123_456.0 * 4 / 6000.0
    )
    (on_sqlite,) = full_section(pgbench=False)["targets"]
    assert on_sqlite["target"] == "4 threads >= 1.5x one thread"
    assert on_sqlite["ok"] is True


def test_missing_pgbench_is_a_note_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writers, "find_pgbench", lambda: None)
    about = writers.run_pgbench(None, "unused", [1, 2], seconds=1, rounds=1)  # type: ignore[arg-type]
    assert about["available"] is False
    assert "pgbench not found" in about["note"]
    section = full_section(pgbench=False)
    section["pgbench"] = about
    result = {
        "scaling": {"postgresql": section},
        "skipped": {},
        "peers": {},
        "notes": [],
        "machine": {"platform": "Linux", "cpu_count": 2, "python": "CPython", "sqlite": "3"},
        "seconds": 1.0,
    }
    assert "pgbench not found" in "\n".join(rendered(result))


# -- the dashboard: its host guard and its diffs (tests/test_ui.py) --------------------
def test_the_host_names_the_guard_allows() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("127.8.0.1")
    assert is_loopback("::1")
    assert is_loopback("[::1]")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")  # noqa: S104
    assert not is_loopback("192.168.1.5")
    assert not is_loopback("example.com")
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert "192.168.1.5" in allowed_hosts("192.168.1.5")
    assert socket.gethostname() in allowed_hosts("0.0.0.0")  # noqa: S104
    assert "dash.internal" in allowed_hosts("0.0.0.0", ["dash.internal"])  # noqa: S104
    # What test_ui.py's test_the_host_names_allowed gives its dashboard:
    assert allowed_hosts("127.0.0.1", ["dash.internal"]) == [
        "127.0.0.1",
        "localhost",
        "::1",
        "[::1]",
        "dash.internal",
    ]
    assert host_refusal("") == "Invalid host header: the request names no host"


def test_the_dashboard_s_limits_are_the_documented_ones() -> None:
    """tests/test_ui.py checks the dashboard against the limits its guide gives."""
    from tests import test_ui

    assert (TIMERS_MAX, QUEUES_MAX) == (test_ui.TIMERS_MAX, test_ui.QUEUES_MAX)
    assert (TIMER_TEXT_MAX, JOB_TEXT_MAX) == (test_ui.TIMER_TEXT_MAX, test_ui.JOB_TEXT_MAX)
    assert MAX_DIFF_CHARS == test_ui.MAX_DIFF_CHARS
    assert server.GRACE == test_ui.GRACE


def test_the_diff_of_an_update_is_a_json_patch_with_values_as_text() -> None:
    assert diff({"n": 1}, {"n": 2}) == {
        "ops": [{"op": "replace", "path": "/n", "old": "1", "value": "2"}],
        "more": 0,
    }
    # JSON's types, not Python's ==: 1, 1.0 and true differ.
    assert diff({"n": 1}, {"n": 1.0})["ops"] == [
        {"op": "replace", "path": "/n", "old": "1", "value": "1.0"}
    ]
    assert diff([1], [True])["ops"] == [
        {"op": "replace", "path": "/0", "old": "1", "value": "true"}
    ]
    assert diff(1, "x")["ops"] == [{"op": "replace", "path": "", "old": "1", "value": '"x"'}]
    assert diff({"a": 1, "b": 2}, {"b": 2, "a": 1}) == {"ops": [], "more": 0}  # keys reordered
    assert diff({"é": "ü"}, {"é": "ö"})["ops"][0]["value"] == '"ö"'
    # Each op's old value is read where it applies, after the ops before it.
    patch = diff({"a": [1, 2, 3, 4]}, {"a": [4]})["ops"]
    document = [1, 2, 3, 4]
    for op in patch:
        index = int(op["path"].rpartition("/")[2])
        assert json.loads(op["old"]) == document[index]
        if op["op"] == "remove":
            del document[index]
        else:
            document[index] = json.loads(op["value"])
    assert document == [4]
    many = diff({f"k{n}": n for n in range(80)}, {f"k{n}": n + 1 for n in range(80)})
    assert (len(many["ops"]), many["more"]) == (MAX_DIFF_OPS, 80 - MAX_DIFF_OPS)
    # Neither value is changed; a value nested as deep as reactor allows still diffs.
    old, new = {"a": [1, {"b": 2}]}, {"a": [{"b": 3}, 1], "c": {"d": [4]}}
    diff(old, new)
    assert (old, new) == ({"a": [1, {"b": 2}]}, {"a": [{"b": 3}, 1], "c": {"d": [4]}})
    deep_old: Any = 1
    deep_new: Any = 2
    for _ in range(249):
        deep_old, deep_new = {"a": deep_old}, {"a": deep_new}
    (op,) = diff(deep_old, deep_new)["ops"]
    assert (op["old"], op["value"]) == ("1", "2")


def test_a_patch_that_does_not_give_the_new_value_is_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the page shows must be what happened: a patch from jsonpatch that does not
    lead to the new value (not expected) gives way to a replace of the whole value."""
    wrong = jsonpatch.JsonPatch([{"op": "add", "path": "/x", "value": 1}])
    monkeypatch.setattr(jsonpatch, "make_patch", lambda *_: wrong)
    assert diff({"n": 1}, {"n": 2}) == {
        "ops": [{"op": "replace", "path": "", "old": '{"n":1}', "value": '{"n":2}'}],
        "more": 0,
    }
    broken = jsonpatch.JsonPatch([{"op": "remove", "path": "/nothing"}])
    monkeypatch.setattr(jsonpatch, "make_patch", lambda *_: broken)
    assert diff([1], [2])["ops"] == [{"op": "replace", "path": "", "old": "[1]", "value": "[2]"}]


# -- export and import: the backup's functions (tests/test_exchange.py) ---------------
def test_export_replaces_a_regular_file_keeping_its_mode(
    state: reactor.State, out_dir: Path
) -> None:
    _fill(state)
    target = out_dir / "backup.jsonl"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    before = os.stat(target)
    assert _exchange.dump_file(state, target) == Tally(keys=5)
    after = os.stat(target)
    assert target.read_text(encoding="utf-8") == _dumped(state)
    assert after.st_ino != before.st_ino  # a new file took its place: replaced, not rewritten
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert sorted(os.listdir(out_dir)) == ["backup.jsonl"]


def test_export_to_a_new_file(state: reactor.State, out_dir: Path) -> None:
    _fill(state)
    assert _exchange.dump_file(state, out_dir / "new.jsonl") == Tally(keys=5)
    assert (out_dir / "new.jsonl").read_text(encoding="utf-8") == _dumped(state)
    assert sorted(os.listdir(out_dir)) == ["new.jsonl"]


def test_a_failed_export_leaves_the_regular_file_as_it_was(
    state: reactor.State, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(state)
    target = out_dir / "backup.jsonl"
    target.write_text("old\n", encoding="utf-8")
    real = ExportView.key_lines

    def failing(*args: Any) -> Any:
        yield from list(real(*args))[:2]
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ExportView, "key_lines", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        _exchange.dump_file(state, target)
    assert target.read_text(encoding="utf-8") == "old\n"
    assert sorted(os.listdir(out_dir)) == ["backup.jsonl"]  # no temporary file left


def test_export_to_a_symlink_writes_through_it(state: reactor.State, out_dir: Path) -> None:
    _fill(state)
    elsewhere = out_dir / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.jsonl"
    target.write_text("old\n", encoding="utf-8")
    link = out_dir / "link.jsonl"
    link.symlink_to(target)
    assert _exchange.dump_file(state, link) == Tally(keys=5)
    assert link.is_symlink()
    assert os.readlink(link) == str(target)
    assert target.read_text(encoding="utf-8") == _dumped(state)
    assert sorted(os.listdir(out_dir)) == ["elsewhere", "link.jsonl"]
    assert sorted(os.listdir(elsewhere)) == ["real.jsonl"]


def test_export_to_a_fifo_writes_through_it(state: reactor.State, out_dir: Path) -> None:
    _fill(state)
    fifo = out_dir / "pipe"
    os.mkfifo(fifo)
    read: list[bytes] = []

    def drain() -> None:
        with open(fifo, "rb") as file:
            read.append(file.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert _exchange.dump_file(state, fifo) == Tally(keys=5)
    reader.join(10)
    assert not reader.is_alive()
    assert read == [_dumped(state).encode()]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(out_dir) == ["pipe"]


def test_export_to_dev_null_leaves_it_a_device(state: reactor.State) -> None:
    _fill(state)
    before = os.lstat("/dev/null")
    assert _exchange.dump_file(state, "/dev/null") == Tally(keys=5)
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev, after.st_mode) == (
        before.st_ino,
        before.st_rdev,
        before.st_mode,
    )


@pytest.mark.parametrize("through_link", [False, True], ids=["directory", "link to one"])
def test_export_to_a_directory_is_an_error(
    state: reactor.State, out_dir: Path, through_link: bool
) -> None:
    _fill(state)
    directory = out_dir / "dir"
    directory.mkdir()
    target = directory
    if through_link:
        target = out_dir / "link"
        target.symlink_to(directory)
    with pytest.raises(InvalidArgumentError, match="directory"):
        _exchange.dump_file(state, target)
    assert directory.is_dir()
    assert os.listdir(directory) == []
    assert sorted(os.listdir(out_dir)) == (["dir", "link"] if through_link else ["dir"])


def test_the_export_command_writes_through_what_is_not_a_regular_file(
    db_path: Any, out_dir: Path
) -> None:
    with reactor.open(db_path) as state:
        _fill(state, ttl=None)
        expected = _dumped(state)
    before = os.lstat("/dev/null")
    done = run_reactor("--db", str(db_path), "export", "/dev/null", cwd=out_dir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exported": 5, **_keys_only(5), "file": "/dev/null"}
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)

    target = out_dir / "real.jsonl"
    target.write_text("old\n", encoding="utf-8")
    (out_dir / "link.jsonl").symlink_to(target)
    done = run_reactor("--db", str(db_path), "export", "link.jsonl", cwd=out_dir)
    assert done.returncode == 0, done.stderr
    assert (out_dir / "link.jsonl").is_symlink()
    assert target.read_text(encoding="utf-8") == expected

    fifo = out_dir / "pipe"
    os.mkfifo(fifo)
    exporting = subprocess.Popen(
        [sys.executable, "-m", "reactor", "--db", str(db_path), "export", str(fifo)],
        cwd=out_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CLI_ENV,
    )
    try:
        with open(fifo, "rb") as file:  # the export opens the FIFO once it has the keys
            assert file.read().decode() == expected
        out, err = exporting.communicate(timeout=60)
    finally:
        exporting.kill()
    assert exporting.returncode == 0, err
    assert json.loads(out) == {"exported": 5, **_keys_only(5), "file": str(fifo)}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(out_dir)) == ["link.jsonl", "pipe", "real.jsonl"]


def test_an_export_to_dev_stdout_is_the_lines_alone(db_path: Any, out_dir: Path) -> None:
    """``export /dev/stdout`` redirected to a file, or piped: the lines only, which
    import again (the summary would land among them)."""
    with reactor.open(db_path) as state:
        _fill(state, ttl=None)
        expected = _dumped(state)
    with open(out_dir / "backup.jsonl", "w") as redirected:
        done = subprocess.run(
            [sys.executable, "-m", "reactor", "--db", str(db_path), "export", "/dev/stdout"],
            cwd=out_dir,
            stdout=redirected,
            stderr=subprocess.PIPE,
            text=True,
            env=CLI_ENV,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert (out_dir / "backup.jsonl").read_text(encoding="utf-8") == expected
    piped = run_reactor("--db", str(db_path), "export", "/dev/stdout", cwd=out_dir)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == expected
    restored = run_reactor("--db", "copy.db", "import", "backup.jsonl", cwd=out_dir)
    assert restored.returncode == 0, restored.stderr
    with reactor.open(out_dir / "copy.db") as copy:
        assert _dumped(copy) == expected


def _bank(state: reactor.State) -> None:
    """Two scopes that transfers move money between, with keys enough between them
    that an export fetches them a few at a time, over several fetches."""
    state.scope("a").set_many({"balance": TOTAL, "moves": 0})
    state.scope("z").set_many({"balance": 0, "moves": 0})
    filler = 2_100
    assert filler > 4 * STREAMED_ROWS  # read over several fetches
    state.scope("m").set_many({f"k{n:05}": n for n in range(filler)})


def test_an_export_does_not_see_what_commits_while_it_reads(
    open_state: Callable[..., reactor.State], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transfers committed between two pages of an export's keys (by another thread,
    awaited) are in none of it: the export is the database as it began."""
    state = open_state()
    _bank(state)
    _transfer(state)
    real = ExportView.key_lines

    def interleaved(view: ExportView) -> Any:
        for n, line in enumerate(real(view)):
            if n % 500 == 1:
                worker = threading.Thread(target=lambda: [_transfer(state) for _ in range(3)])
                worker.start()
                worker.join(timeout=30)
                assert not worker.is_alive()
            yield line

    monkeypatch.setattr(ExportView, "key_lines", interleaved)
    out = io.StringIO()
    tally = _exchange.dump(state, out)
    assert _check_whole(out.getvalue()) == 1  # only the transfer made before it began
    assert tally.jobs == 1
    assert state.scope("a").get("moves") == 16  # while 5 x 3 others did commit


def test_exports_while_transfers_run_hold_each_transfer_whole(
    open_state: Callable[..., reactor.State], db_path: Any, tmp_path: Path
) -> None:
    """Exports (the command, in another process) while a thread moves money between two
    scopes, a job per transfer: every export holds each transfer whole or not at all."""
    state = open_state()
    _bank(state)
    stop = threading.Event()

    def transfers() -> None:
        while not stop.is_set():
            _transfer(state)

    worker = threading.Thread(target=transfers)
    worker.start()
    seen = []
    try:
        for _ in range(4):
            done = run_reactor("--db", str(db_path), "export", cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            seen.append(_check_whole(done.stdout))
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    assert seen == sorted(seen)
    assert seen[-1] > seen[0]  # the exports saw transfers go on


def test_an_export_racing_close_ends_whole_or_with_an_error(
    open_state: Callable[..., reactor.State], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handle closes while an export is between two fetches: the export ends, in
    time, whole or with a ReactorError; never a hang, a raw driver error or a torn
    file written as if complete."""
    state = open_state()
    _bank(state)
    reading, go_on = threading.Event(), threading.Event()
    real = ExportView.key_lines

    def paused(view: ExportView) -> Any:
        for n, line in enumerate(real(view)):
            if n == 500:
                reading.set()
                go_on.wait(30)
            yield line

    monkeypatch.setattr(ExportView, "key_lines", paused)
    outcome: list[Any] = []
    out = io.StringIO()

    def export() -> None:
        try:
            outcome.append(_exchange.dump(state, out))
        except BaseException as exc:  # what it raised is checked below
            outcome.append(exc)

    exporter = threading.Thread(target=export)
    exporter.start()
    assert reading.wait(30)
    closer = threading.Thread(target=state.close)
    closer.start()
    time.sleep(0.2)  # close() begins while the export holds its snapshot
    go_on.set()
    exporter.join(30)
    closer.join(30)
    assert not exporter.is_alive()
    assert not closer.is_alive()
    (result,) = outcome
    if isinstance(result, Tally):
        _check_whole(out.getvalue())
        assert result.keys == 2_104
    else:
        assert isinstance(result, reactor.ReactorError), repr(result)


def test_an_import_is_one_commit_with_its_events(
    state: reactor.State, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(state)
    engine = engine_of(state)
    commits: list[int] = []
    real = engine.store.write

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        commits.append(len(result[1]))
        return result

    events: list[tuple[str, str, str]] = []
    state.subscribe(lambda event: events.append((event.type, event.scope, event.key)))
    monkeypatch.setattr(engine.store, "write", counted)
    lines = [*_lines(2500), json.dumps({"scope": "orders", "key": "o-1", "value": 1})]
    assert _exchange.load(state, lines) == Tally(keys=2501)
    monkeypatch.undo()
    assert commits == [2501]
    wait_for(lambda: len(events) == 2501)
    assert events.count(("updated", "orders", "o-1")) == 1
    assert sum(kind == "created" for kind, _, _ in events) == 2500
    assert state.scope("s1").get("k1") == {"n": 1}
    assert state.scope("s0").ttl("k0") == 60.0  # counted from the commit's (fake) clock
    assert state.scope("s1").ttl("k1") == -1


def test_an_import_writes_a_scope_only_once_its_owner_hands_it_over(
    state: reactor.State,
) -> None:
    """The import goes through the scopes' owners, as a transaction does: a transaction
    holding a scope finishes first (it used to be overwritten under it, and then fail
    with ConflictError), and the import's value comes after it."""
    lines = [json.dumps({"scope": "s", "key": "k", "value": "imported"})]
    outcome: list[Any] = []
    importer = threading.Thread(target=lambda: outcome.append(_exchange.load(state, lines)))
    with state.scope("s").transaction() as tx:
        tx.set("k", "from the transaction")
        importer.start()
        importer.join(0.5)
        assert importer.is_alive()  # waiting for the scope
        assert tx.get("k") == "from the transaction"
    importer.join(10)
    assert outcome == [Tally(keys=1)]
    assert [event.new_value for event in state.changes(scope="s")] == [
        "from the transaction",
        "imported",
    ]


def test_a_key_given_twice_takes_its_last_entry(state: reactor.State) -> None:
    lines = [
        json.dumps({"scope": "s", "key": "k", "value": 1, "ttl": 5}),
        json.dumps({"scope": "s", "key": "k", "value": 2}),
    ]
    assert _exchange.load(state, lines) == Tally(keys=1)
    assert state.scope("s").get("k") == 2
    assert state.scope("s").ttl("k") == -1


def test_an_import_checks_values_against_the_databases_limits(
    open_state: Callable[..., reactor.State],
) -> None:
    state = open_state(max_value_bytes=100)
    state.scope("s").set("kept", 1)
    lines = [
        json.dumps({"scope": "s", "key": "small", "value": 1}),
        json.dumps({"scope": "s", "key": "big", "value": "x" * 200}),
    ]
    before = _dumped(state)
    with pytest.raises(InvalidValueError, match="scope 's', key 'big': "):
        _exchange.load(state, lines)
    assert _dumped(state) == before


def _failing_after(monkeypatch: pytest.MonkeyPatch, calls: int, error: BaseException) -> list[int]:
    """Make the transaction's ``live_row`` raise ``error`` at its ``calls``-th call
    (the import asks for each key's row before it stages the key)."""
    real = WriteTxn.live_row
    seen = [0]

    def live_row(self: WriteTxn, scope: str, key: str) -> Row | None:
        seen[0] += 1
        if seen[0] == calls:
            raise error
        return real(self, scope, key)

    monkeypatch.setattr(WriteTxn, "live_row", live_row)
    return seen


@pytest.mark.parametrize(
    "error", [RuntimeError("the disk failed"), KeyboardInterrupt()], ids=["failure", "Ctrl-C"]
)
def test_an_import_that_fails_halfway_changes_nothing(
    state: reactor.State, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    _fill(state)
    before, revision = _dumped(state), state.stats()["revision"]
    events: list[tuple[str, str]] = []
    state.subscribe(lambda event: events.append((event.scope, event.key)))
    lines = [*_lines(3000), json.dumps({"scope": "orders", "key": "o-1", "value": "new"})]
    seen = _failing_after(monkeypatch, 2500, error)  # a few batches in: half written
    with pytest.raises(type(error)):
        _exchange.load(state, lines)
    assert seen[0] == 2500
    monkeypatch.undo()
    assert _dumped(state) == before
    assert state.stats()["revision"] == revision
    assert state.changes(since=revision) == []
    # Events come in revision order: had the import published any, they would come
    # before the sentinel's.
    state.scope("sentinel").set("k", 1)
    wait_for(lambda: events)
    assert events == [("sentinel", "k")]
    # And the database still takes the import.
    assert _exchange.load(state, lines) == Tally(keys=3001)
    assert state.scope("orders").get("o-1") == "new"


def _export(state: reactor.State, *args: Any, **kwargs: Any) -> tuple[Tally, list[str]]:
    out = io.StringIO()
    tally = _exchange.dump(state, out, *args, **kwargs)
    return tally, out.getvalue().splitlines()


def test_keys_timers_and_queues_round_trip(
    state: reactor.State,
    clock: ManualClock,
    open_state: Callable[..., reactor.State],
    fresh_db: Any,
) -> None:
    timers = _fill_timers_and_queues(state)
    tally, lines = _export(state)
    assert tally == Tally(keys=5, timers=3, queues=2, jobs=5)
    parsed = [json.loads(line) for line in lines]
    # The dead job "x" was nacked: its attempt's error (none said) and worker go along.
    (nacked,) = parsed[13].pop("errors")
    assert (nacked["attempt"], nacked["error"], nacked["worker"]["pid"]) == (1, None, os.getpid())
    assert parsed[5:] == [
        _timer(timers["once"], "value", {"due": True}, 30.0),
        _timer(timers["beat"], "ops", [{"type": "increment", "path": "", "by": 1}], 60.0),
        _timer(timers["other"], "value", 1.5, 90.0),
        {"queue": "emails", "max_attempts": 3},
        _job("emails", "c", 0, "ready", 0.0, "kc"),
        _job("emails", "b", 0, "ready", 20.0, "kb"),
        # Taken: ready at once, its take counted (no worker holds it after a restore).
        _job("emails", "a", 1, "ready", 0.0, None),
        {"queue": "fragile", "max_attempts": 1},
        _job("fragile", "x", 1, "dead", 0.0, None),
        # Taken with no attempt left: dead, as when its lease runs out.
        _job("fragile", "y", 1, "dead", 0.0, "ky"),
    ]

    # Into another database, whose clock says another time: times count from it.
    later = ManualClock(start=clock.time() + 86_400)
    restored = open_state(fresh_db, clock=later)
    assert _exchange.load(restored, lines) == Tally(keys=5, timers=3, queues=2, jobs=5)
    assert _export(restored, kinds=("keys", "timers")) == _export(state, kinds=("keys", "timers"))
    assert restored.timers() == [
        reactor.Timer(timer.id, timer.scope, timer.key, timer.due + 86_400, timer.every)
        for timer in timers.values()
    ]
    emails, fragile = restored.queue("emails"), restored.queue("fragile")
    assert emails.stats() == {
        "ready": 2,
        "delayed": 1,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert fragile.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 0,
        "dead": 2,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert (_max_attempts(restored, "emails"), _max_attempts(restored, "fragile")) == (3, 1)
    dead = fragile.dead()
    assert [(job.item, job.attempts) for job in dead] == [("x", 1), ("y", 1)]
    assert fragile.put("again", key="ky") == dead[1].id  # the keys came along
    assert _took(emails) == ("c", 1)
    assert _took(emails) == ("a", 2)
    assert _took(emails) is None  # "b" is 20 seconds away
    later.advance(20)
    assert _took(emails) == ("b", 1)
    # The jobs came in as events of scope queue:NAME, as a put's do.
    created = [e for e in restored.changes(scope="queue:emails") if e.type == "created"]
    assert [e.new_value["item"] for e in created] == ["c", "b", "a"]

    # A restored timer fires once, when its time comes on the new clock.
    orders = restored.scope("orders")
    later.advance(9)  # 29 s after the import
    run_upkeep(restored)
    time.sleep(0.2)
    assert orders.get("reminder") is None
    later.advance(2)
    wait_for(lambda: orders.get("reminder") == {"due": True})
    later.advance(30)
    wait_for(lambda: orders.get("beats") == 1)
    run_upkeep(restored)
    time.sleep(0.2)
    fired = [e.timer for e in restored.changes(scope="orders") if e.timer is not None]
    assert fired == [timers["once"].id, timers["beat"].id]
    assert [t.id for t in restored.timers()] == [timers["other"].id, timers["beat"].id]


def test_an_export_of_some_scopes_has_their_timers_and_no_queue(state: reactor.State) -> None:
    timers = _fill_timers_and_queues(state)
    tally, lines = _export(state, "c*")
    assert tally == Tally(keys=1, timers=1)
    assert [json.loads(line).get("timer") for line in lines] == [None, timers["other"].id]
    tally, lines = _export(state, kinds=("queues",))
    assert tally == Tally(queues=2, jobs=5)
    assert all("queue" in json.loads(line) for line in lines)
    tally, lines = _export(state, kinds=("keys", "timers"))
    assert tally == Tally(keys=5, timers=3)


def test_an_overdue_timer_fires_once_at_once_after_an_import(
    state: reactor.State, clock: ManualClock
) -> None:
    late = {"timer": "late", "scope": "s", "key": "k", "value": 1, "due_in": -5}
    beat = {"timer": "beat", "scope": "s", "key": "n", "ops": [ops.increment("")], "due_in": -150}
    lines = [json.dumps(late), json.dumps({**beat, "every": 60})]
    assert _exchange.load(state, lines) == Tally(timers=2)
    scope = state.scope("s")
    wait_for(lambda: scope.get("k") == 1 and scope.get("n") == 1)
    (pending,) = state.timers()
    assert pending.due == clock.time() + 30  # missed periods fire once, then it keeps its period
    run_upkeep(state)
    time.sleep(0.2)
    assert (scope.get("n"), len(state.changes(scope="s"))) == (1, 2)


def test_a_timer_imported_again_replaces_the_timer_of_its_id(
    state: reactor.State, clock: ManualClock
) -> None:
    timer = state.scope("s").schedule("k", 1, after=30)
    _, lines = _export(state)
    clock.advance(10)
    assert _exchange.load(state, [lines[0].replace('"value":1', '"value":2')]) == Tally(timers=1)
    assert state.timers() == [reactor.Timer(timer.id, "s", "k", clock.time() + 30, None)]
    clock.advance(30)
    wait_for(lambda: state.scope("s").get("k") == 2)
    wait_for(lambda: state.timers() == [])


def test_an_old_key_only_file_imports_as_before(state: reactor.State) -> None:
    lines = [
        '{"scope": "orders", "key": "o-1", "value": {"total": 120}, "ttl": null}',
        '{"scope": "cache", "key": "rate", "value": 1.08, "ttl": 42.5}',
        '{"scope": "flags", "key": "on", "value": true}',
    ]
    assert _exchange.load(state, lines) == Tally(keys=3)
    assert state.scope("cache").ttl("rate") == 42.5
    assert state.scope("orders").get("o-1") == {"total": 120}
    assert (state.timers(), state.queues()) == ([], [])


def test_an_import_skips_a_job_whose_key_a_job_of_its_queue_holds(state: reactor.State) -> None:
    queue = state.queue("emails")
    held = queue.put("first", key="k1")
    lines = [
        _job("emails", "again", 0, "ready", 0.0, "k1"),  # held in the database
        _job("emails", "new", 0, "ready", 0.0, "k2"),
        _job("emails", "twice", 0, "ready", 0.0, "k2"),  # held by the line before
        _job("emails", "no key", 0, "ready", 0.0, None),
    ]
    assert _exchange.load(state, map(json.dumps, lines)) == Tally(queues=1, jobs=2, skipped=2)
    assert queue.put("x", key="k1") == held
    assert [_took(queue), _took(queue), _took(queue), _took(queue)] == [
        ("first", 1),
        ("new", 1),
        ("no key", 1),
        None,
    ]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({**_TIMER, "colour": "red"}, "unknown field 'colour'"),
        ({**_TIMER, "every": 0}, "'every' must be a number of seconds > 0, not 0"),
        ({**_TIMER, "every": "hourly"}, "'every' must be a number of seconds > 0"),
        ({**_TIMER, "due_in": "soon"}, "'due_in' must be a finite number of seconds"),
        ({**_TIMER, "due_in": True}, "'due_in' must be a finite number of seconds"),
        ({**_TIMER, "due_in": 1e400}, "not JSON"),  # Infinity
        ({k: v for k, v in _TIMER.items() if k != "due_in"}, "missing 'due_in'"),
        ({**_TIMER, "ops": [{"type": "increment", "path": ""}]}, "a value or applies ops"),
        ({**_TIMER, "value": 1, "ops": "nope"}, "a value or applies ops"),
        ({k: v for k, v in _TIMER.items() if k != "value"}, "a value or applies ops"),
        ({**_TIMER, "timer": ""}, "a timer id has 1 to 64 characters"),
        ({**_TIMER, "timer": "t" * 65}, "a timer id has 1 to 64 characters"),
        ({**_TIMER, "key": ""}, "a key must not be empty"),
        ({**_TIMER, "value": _nested(70)}, "value nests deeper than 64 levels"),
        ({**_JOB, "state": "taken"}, "'state' must be 'ready' or 'dead', not 'taken'"),
        ({**_JOB, "attempts": -1}, "'attempts' must be an int >= 0, not -1"),
        ({**_JOB, "attempts": 1.0}, "'attempts' must be an int >= 0, not 1.0"),
        ({**_JOB, "ready_in": -1}, "'ready_in' must be a finite number of seconds >= 0"),
        ({**_JOB, "key": ""}, "idempotency key must not be empty"),
        ({**_JOB, "colour": "red"}, "unknown field 'colour'"),
        ({**_JOB, "errors": [1, 2]}, "'errors' must be a list of objects with an 'error'"),
        ({**_JOB, "errors": [{"error": 5}]}, "'errors' must be a list of objects"),
        ({**_JOB, "errors": {"error": "x"}}, "'errors' must be a list of objects"),
        ({**_JOB, "priority": 1.5}, "priority must be a 32-bit int"),
        ({**_JOB, "group": ""}, "a group must not be empty"),
        ({"queue": "q", "concurrency": 0}, "concurrency must be an int >= 1"),
        ({"queue": "q", "rate": [1]}, "rate must be (limit, seconds)"),
        ({k: v for k, v in _JOB.items() if k != "item"}, "missing 'item'"),
        ({"queue": "q", "max_attempts": 0}, "max_attempts must be an int >= 1, not 0"),
        ({"queue": ""}, "a queue name must not be empty"),
    ],
)
def test_a_bad_timer_or_job_line_imports_nothing(
    state: reactor.State, line: dict[str, Any], error: str
) -> None:
    state.scope("kept").set("k", 1)
    before = _dumped(state)
    with pytest.raises(
        InvalidArgumentError, match="1 bad line, nothing imported: line 5: "
    ) as info:
        _exchange.load(state, [*_good_lines(), json.dumps(line)])
    assert error in str(info.value)
    assert _dumped(state) == before
    assert (state.timers(), state.queues()) == ([], [])


@pytest.mark.parametrize("scope", ["queue:q", "run:w"])
def test_a_key_or_timer_of_a_scope_of_events_imports_nothing(
    state: reactor.State, scope: str
) -> None:
    # No export writes such lines: a queue's events are its jobs, exported as jobs.
    state.scope("kept").set("k", 1)
    before = _dumped(state)
    # A timer of a queue's scope that puts a value is a periodic put (Queue.put_every):
    # one that applies ops is refused there, as every timer of a run's scope.
    timer = _OPS_TIMER if scope.startswith("queue:") else _TIMER
    lines = [
        json.dumps({"scope": scope, "key": "1", "value": {"state": "ready"}}),
        json.dumps({**timer, "scope": scope}),
    ]
    with pytest.raises(
        InvalidArgumentError, match="2 bad lines, nothing imported: line 5: cannot write to scope"
    ) as info:
        _exchange.load(state, [*_good_lines(), *lines])
    assert "line 6: cannot write to scope" in str(info.value)
    assert "reserved for the events of queues and workflow runs" in str(info.value)
    assert _dumped(state) == before
    assert (state.timers(), state.queues()) == ([], [])


def test_a_database_with_queues_round_trips(
    state: reactor.State, open_state: Callable[..., reactor.State], fresh_db: Any
) -> None:
    # Their events, scopes queue:NAME in the log, are not exported: their jobs are.
    q = state.queue("q")
    q.put("done")
    q.put("waiting", key="w")
    _took(q)
    with state.scope("orders").transaction() as tx:
        tx.set("o-1", 1)
        tx.enqueue("q", "from the outbox")
    assert {e.scope for e in state.changes()} == {"orders", "queue:q"}
    tally, lines = _export(state)
    assert tally == Tally(keys=1, timers=0, queues=1, jobs=2)
    assert [json.loads(line).get("scope") for line in lines] == ["orders", None, None, None]
    restored = open_state(fresh_db)
    assert _exchange.load(restored, lines) == tally
    assert _export(restored) == (tally, lines)
    assert [e.new_value["item"] for e in restored.changes(scope="queue:q")] == [
        "waiting",
        "from the outbox",
    ]
    assert _took(restored.queue("q")) == ("waiting", 1)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({**_TIMER, "value": "x" * 200}, "timer 't2': value is "),
        ({**_OPS_TIMER, "ops": [ops.set("a", "x" * 200)]}, "timer 't2': value is "),
        ({**_JOB, "item": "x" * 200}, "queue 'q', its job 2 in the file: value is "),
    ],
)
def test_a_timer_or_job_beyond_the_databases_limits_imports_nothing(
    open_state: Callable[..., reactor.State], line: dict[str, Any], error: str
) -> None:
    state = open_state(max_value_bytes=100)
    state.scope("kept").set("k", 1)
    before = _dumped(state)
    with pytest.raises(InvalidValueError, match=re.escape(error)):
        _exchange.load(state, [*_good_lines(), json.dumps(line)])
    assert _dumped(state) == before
    assert (state.timers(), state.queues()) == ([], [])


@pytest.mark.parametrize(
    "error", [RuntimeError("the disk failed"), KeyboardInterrupt()], ids=["failure", "Ctrl-C"]
)
def test_an_import_that_fails_in_its_jobs_changes_nothing(
    state: reactor.State, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    timer = state.scope("s").schedule("k", "kept", after=30)
    state.queue("q").put("kept", key="held")
    before, revision, timers = _dumped(state), state.stats()["revision"], state.timers()
    lines = [
        *_good_lines(),
        json.dumps({**_TIMER, "timer": timer.id, "value": "replaced"}),
        *(json.dumps(_job("q", n, 0, "ready", 0.0, f"k{n}")) for n in range(1500)),
    ]
    real = _jobs.restore
    calls = [0]

    def restore(*args: Any) -> int:
        calls[0] += 1
        if calls[0] == 2:  # keys, timers, settings and a first batch of jobs written
            raise error
        return real(*args)

    monkeypatch.setattr(_jobs, "restore", restore)
    with pytest.raises(type(error)):
        _exchange.load(state, lines)
    monkeypatch.undo()
    assert calls[0] == 2
    assert _dumped(state) == before
    assert state.timers() == timers
    assert state.queue("q").stats() == {
        "ready": 1,
        "delayed": 0,
        "taken": 0,
        "dead": 0,
        "taken_by_group": {},
        "rate_window": 0,
    }
    assert _max_attempts(state, "q") == 5
    assert state.stats()["revision"] == revision
    assert _exchange.load(state, lines) == Tally(keys=1, timers=2, queues=1, jobs=1501)


def _dumped(state: reactor.State) -> str:
    """Every key of the database, as an export writes it."""
    out = io.StringIO()
    _exchange.dump(state, out)
    return out.getvalue()


@pytest.mark.sqlite_only("SQLite schema versions")
def test_a_database_of_schema_7_keeps_its_timers_and_takes_cron_ones(tmp_path: Path) -> None:
    """Version 8 adds the expression and zone to the timers' table: the timers already
    there stay, and fire, as they were."""
    import sqlalchemy as sa

    older = tmp_path / "older.db"
    engine = sa.create_engine(f"sqlite:///{older}")
    _schema.migrate(engine, target=7)
    engine.dispose()
    raw_query(
        older,
        "INSERT INTO reactor_timers (id, scope, key, due, every, value, ops, created_at) "
        "VALUES ('old', 's', 'k', 100.0, 60.0, '1', NULL, 0.0)",
    )
    monday = dt.datetime(2026, 1, 5, 8, 58, tzinfo=dt.UTC).timestamp()
    clock = ManualClock(monday)
    with reactor.open(older, clock=clock, sweep_interval=1e6) as state:
        (kept,) = state.timers()
        assert kept == reactor.Timer("old", "s", "k", 100.0, 60.0, None, None)
        run_upkeep(state)  # overdue: fires once, then every 60 s from its first due time
        assert state.scope("s").get("k") == 1
        cron = state.scope("s").schedule("c", 2, cron="0 9 * * *")
        assert cron.due == monday + 120
    assert raw_query(older, "SELECT value FROM reactor_meta WHERE name = 'schema_version'") == [
        (_schema.SCHEMA_VERSION,)
    ]


@pytest.mark.sqlite_only("SQLite schema versions")
def test_a_database_of_schema_8_keeps_its_jobs_and_takes_flow_control(tmp_path: Path) -> None:
    """Version 9 adds the queues' flow control and the jobs' priority, group, errors
    and taker: the jobs already there stay, in their order, with their keys."""
    import sqlalchemy as sa

    older = tmp_path / "older.db"
    engine = sa.create_engine(f"sqlite:///{older}")
    _schema.migrate(engine, target=8)
    engine.dispose()
    raw_query(older, "INSERT INTO reactor_queues (name, max_attempts, next_id) VALUES ('q', 2, 3)")
    for job_id, key in ((1, "k1"), (2, None)):
        raw_query(
            older,
            "INSERT INTO reactor_jobs (queue, id, item, state, ready_at, attempts, owner, key, "
            "created_at) VALUES ('q', ?, ?, 'ready', ?, 0, NULL, ?, 0.0)",
            (job_id, str(job_id * 10), float(job_id), key),
        )
    with reactor.open(older, clock=ManualClock(), sweep_interval=1e6) as state:
        q = state.queue("q", concurrency=1)
        assert q.put("again", key="k1") == 1  # the key came along
        assert q.put("urgent", priority=1) == 3
        first = q.take(timeout=0)
        assert first is not None
        assert first.item == "urgent"
        assert q.take(timeout=0) is None  # concurrency 1, stored in the new column
        first.nack(error="boom")
        info = q.job(3)
        assert info is not None
        assert [e["error"] for e in info.errors] == ["boom"]
        job = q.take(timeout=0)
        assert job is not None
        assert job.item == "urgent"
    assert raw_query(older, "SELECT value FROM reactor_meta WHERE name = 'schema_version'") == [
        (_schema.SCHEMA_VERSION,)
    ]


# -- run.wait_for: a wake-up the database fails is tried again ---------------------------


def test_a_wake_up_of_a_run_that_the_database_fails_is_tried_again(
    open_state: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The key a suspended run waits for changes; making the run ready fails twice
    (the database stayed busy): it is tried again, and the run ends long before its
    timeout (60 s), rather than waiting for the key's next change.

    A wake-up may come by two paths at once (the key's event, and the run's suspension
    seen after the key changed: harmless, the second finds the run ready), so each
    wake-up fails its own first two tries (CI saw both paths fail once each)."""
    real = _runs.wake
    failed: list[str] = []

    def busy_twice(options: Any, workflow: str, run_id: str, position: int) -> Any:
        work = real(options, workflow, run_id, position)
        tries: list[int] = []

        def attempt(txn: WriteTxn) -> bool:
            if len(tries) < 2:
                tries.append(1)
                failed.append(run_id)
                raise BusyError("injected: the database stayed busy")
            return work(txn)

        return attempt

    monkeypatch.setattr(_runs, "wake", busy_twice)
    state = open_state()

    @state.workflow("gated")
    def gated(run: reactor.Run, _input: Any) -> Any:
        return run.wait_for("gates", "open", timeout=60)

    with state.serve(workflows=["gated"], concurrency=1):
        handle = state.start("gated", None)
        poll(lambda: state.run_info(handle.id).status == "suspended", timeout=10)
        state.scope("gates").set("open", "yes")
        assert handle.result(timeout=10) == "yes"
    assert failed in ([handle.id] * 2, [handle.id] * 4)
    assert "trying again in 0.05 s" in caplog.text
    assert "trying again in 0.2 s" in caplog.text


# -- derived values: changes compacted away before this process read them ----------------


def _write_unlogged(database: str, scope: str, key: str, text: str) -> None:
    """A key written past reactor: no change record, so no event (a change lost)."""
    sql = (
        "INSERT INTO reactor_kv (scope, key, value, expires_at, revision, created_revision, "
        "version) VALUES (?, ?, ?, NULL, 1, 1, 1)"
    )
    if "://" in database:
        with raw_postgres(database) as conn:
            conn.execute(sql.replace("?", "%s"), (scope, key, text))
        return
    conn = sqlite3.connect(database)
    with conn:
        conn.execute(sql, (scope, key, text))
    conn.close()


def test_derived_values_are_built_again_when_changes_were_compacted_away_unread(
    open_state: Opener, db_path: Any
) -> None:
    """The follower found changes compacted away before it could hand them on (it was
    behind by more than the log keeps): a count kept up from each change cannot know
    what they were, so it is built again from a snapshot, as a computed value runs
    again. (The gap is told as the dispatcher tells it; the lost change is a row
    written under the log's feet.)"""
    state = open_state()
    orders = state.scope("orders")
    orders.set("o-1", {"status": "new"})
    new = state.count("orders", "o-*", where=lambda v: v["status"] == "new")
    listed = state.derive(lambda r: r.scope("orders").keys("o-*"))
    engine = engine_of(state)
    _write_unlogged(str(db_path), "orders", "o-2", '{"status": "new"}')
    orders.set("o-1", {"status": "new", "seen": True})  # no count change: stays 1
    assert new.wait_for(lambda n: n == 1, timeout=10) == 1
    assert engine.dispatcher.on_gap is not None
    engine.dispatcher.on_gap()
    assert new.wait_for(lambda n: n == 2, timeout=10) == 2
    assert listed.wait_for(lambda keys: keys == ["o-1", "o-2"], timeout=10)


def _between_rounds(idle: float) -> dict[str, Any]:
    """An upkeep report of a live thread resting ``idle`` seconds after a round that failed."""
    return {
        "running": True,
        "busy_for": None,
        "last_round_age": idle,
        "failing": 3,
        "failing_for": idle,
        "last_error": "BusyError: the database is locked",
        "overdue": 0.0,
    }


def test_liveness_allows_the_rest_between_two_rounds_and_no_more() -> None:
    """After a round that failed the thread rests its interval and a retry pause: a
    probe landing then saw it past ``max_lag`` (CI, --max-lag 0.3 with 0.05 + 0.25 of
    rest); it is dead only once no chore has begun for ``max_lag`` past that rest."""
    assert problems(_between_rounds(0.55), 0.3, whole=False, rest=0.3) == []
    [late] = problems(_between_rounds(0.65), 0.3, whole=False, rest=0.3)
    assert late.startswith("the upkeep's last round ended 0.7 s ago (more than 0.6 s")
    assert problems(_between_rounds(0.35), 0.3, whole=False) != []  # no rest: no allowance
