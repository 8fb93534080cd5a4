"""An adversarial campaign against the workflow primitives of SPEC §13: versions and
``if_revision``, history and ``get(at_revision=)``, ``wait_for``, timers, and
transactions over several scopes, on both backends.

Every test states the promise it attacks (SPEC or docs). It found seven bugs, fixed
since: timers of one scope starved by another's held ones, a recurring timer whose
periods overflow a float stopping its scope's timers, no way to cancel a timer in a
transaction, a wait racing close() missing a committed value, history() gapped by a
compaction between pages, get(at_revision=) of a key already past its deadline then,
and a huge int as a time raising OverflowError. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import engine_of

from .conftest import wait_for as poll

Opener = Callable[..., reactor.State]
PATIENCE = 10.0  # seconds any single wait in this file may take, at most


def _in_other_process(db: Any, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``state`` open on ``db`` in a process of its own; its output."""
    program = "import sys, time, reactor\nfrom reactor import ops\n"
    program += "with reactor.open(sys.argv[1]) as state:\n"
    program += textwrap.indent(textwrap.dedent(code), "    ")
    return subprocess.run(
        [sys.executable, "-c", program, str(db), *args],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )


def _spawn(db: Any, code: str, *args: str) -> subprocess.Popen[str]:
    program = "import sys, time, reactor\nfrom reactor import ops\n"
    program += "state = reactor.open(sys.argv[1])\n" + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", program, str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _last_revision(state: reactor.State) -> int:
    return state.scope("-probe-").snapshot().revision


def _waiting_in_thread(
    scope: reactor.Scope, key: str, goal: Any
) -> tuple[threading.Thread, list[Any]]:
    """A thread waiting for ``key`` (which exists) to hold ``goal``, returned once it
    listens, and the list that will hold what its wait returned or raised."""
    outcome: list[Any] = []
    listening = threading.Event()

    def predicate(value: Any) -> bool:
        listening.set()
        return bool(value == goal)

    def waiter() -> None:
        try:
            outcome.append(scope.wait_for(key, predicate, timeout=PATIENCE))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    assert listening.wait(PATIENCE)
    return thread, outcome


def _elsewhere(call: Callable[[], Any]) -> Any:
    """``call()`` in another thread (a read that a transaction body may not make)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(PATIENCE)
    assert result, "the call raised or did not return"
    return result[0]


# == versions, if_revision, history, at_revision: against a model =====================

KEYS = ("a", "b", "c")
values = st.one_of(st.integers(0, 2), st.lists(st.integers(0, 2), max_size=2))
conds = st.sampled_from(["none", "right", "wrong", "zero"])
step = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(KEYS), values, conds),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), conds),
    st.tuples(st.just("increment"), st.sampled_from(KEYS), conds),
    st.tuples(st.just("push"), st.sampled_from(KEYS), st.integers(0, 2), conds),
    st.tuples(st.just("pop"), st.sampled_from(KEYS), st.booleans(), conds),
    st.tuples(
        st.just("cas"),
        st.sampled_from(KEYS),
        st.sampled_from([reactor.MISSING, 0, 1]),
        st.sampled_from([reactor.MISSING, 0, 1]),
        conds,
    ),
    st.tuples(st.just("expire"), st.sampled_from(KEYS), conds),
    st.tuples(
        st.just("set_many"),
        st.dictionaries(st.sampled_from(KEYS), st.integers(0, 2), min_size=1),
        st.one_of(st.none(), st.floats(0, 1)),
    ),
    st.tuples(
        st.just("clear"), st.sampled_from(["*", "a", "[ab]"]), st.one_of(st.none(), st.floats(0, 1))
    ),
)
_model_scopes = itertools.count()


class _Model:
    """One scope as the spec describes it: values, revisions, versions, the log."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.revision = base
        self.rows: dict[str, dict[str, Any]] = {}  # key -> value, revision, created, version
        self.log: list[tuple[str, str, Any, Any, int, int]] = []  # key, type, old, new, ver, rev
        self.at: dict[int, dict[str, Any]] = {base: {}}

    def write(self, key: str, new: Any) -> None:
        """Stage ``new`` (reactor.MISSING: delete) at ``key``; record a change if any."""
        row = self.rows.get(key)
        if new is reactor.MISSING:
            if row is None:
                return
            self.revision += 1
            self.log.append((key, "deleted", row["value"], None, 0, self.revision))
            del self.rows[key]
        elif row is None:
            self.revision += 1
            self.rows[key] = {
                "value": new,
                "revision": self.revision,
                "created": self.revision,
                "version": 1,
            }
            self.log.append((key, "created", None, new, 1, self.revision))
        elif row["value"] == new and type(row["value"]) is type(new):
            return
        else:
            self.revision += 1
            old = row["value"]
            row.update(value=new, revision=self.revision, version=row["version"] + 1)
            self.log.append((key, "updated", old, new, row["version"], self.revision))
        self.at[self.revision] = {k: r["value"] for k, r in self.rows.items()}

    def current(self, key: str) -> int:
        row = self.rows.get(key)
        return 0 if row is None else row["revision"]

    def changed_after(self, keys: Any, revision: int) -> bool:
        return any(k in keys and rev > revision for k, *_, rev in self.log)


def _condition(model: _Model, key: str, cond: str) -> int | None:
    if cond == "none":
        return None
    if cond == "zero":
        return 0
    right = model.current(key)
    return right if cond == "right" else right + 1


@settings(
    max_examples=35,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=25))
def test_versions_history_and_at_revision_match_a_model(  # noqa: PLR0912
    state: reactor.State, steps: list[tuple[Any, ...]]
) -> None:
    """SPEC §13 Versions and History; verbs.md 'every write ... if_revision=R'."""
    scope = state.scope(f"model-{next(_model_scopes)}")
    model = _Model(scope.snapshot().revision)
    for raw in steps:
        verb, *args = raw
        expect_conflict = False
        if verb in ("set_many", "clear"):
            what, fraction = args
            revision = None if fraction is None else int(fraction * model.revision)
            if verb == "set_many":
                written = set(what)
            else:
                pattern = {"*": set(KEYS), "a": {"a"}, "[ab]": {"a", "b"}}[what]
                written = pattern
            if revision == 0:
                expect_conflict = any(k in model.rows for k in written)
            elif revision is not None:
                expect_conflict = model.changed_after(written, revision)
            if expect_conflict:
                with pytest.raises(reactor.ConflictError):
                    getattr(scope, verb)(what, if_revision=revision)
            elif verb == "set_many":
                result = scope.set_many(what, if_revision=revision)
                expected = {}
                for key, value in what.items():
                    old = model.rows.get(key, {}).get("value")
                    expected[key] = reactor.Change(old, value)
                    model.write(key, value)
                assert result == expected
            else:
                gone = sorted(k for k in model.rows if k in written)
                assert scope.clear(what, if_revision=revision) == len(gone)
                for key in gone:
                    model.write(key, reactor.MISSING)
        else:
            key, *rest, cond = args
            condition = _condition(model, key, cond)
            row = model.rows.get(key)
            value = None if row is None else row["value"]
            if condition is not None and condition != model.current(key):
                with pytest.raises(reactor.ConflictError):
                    _apply(scope, verb, key, rest, condition)
            elif (
                row is not None
                and type(value) is not {"increment": int}.get(verb, list)
                and (verb in ("increment", "push", "pop"))
            ):
                with pytest.raises(reactor.TypeMismatchError):
                    _apply(scope, verb, key, rest, condition)
            else:
                result = _apply(scope, verb, key, rest, condition)
                assert result == _expect(model, verb, key, rest, value, row is not None)
        # After every step: each key's entry says what the model says.
        for key in KEYS:
            entry = scope.entry(key)
            row = model.rows.get(key)
            if row is None:
                assert entry is None, key
            else:
                assert entry == reactor.Entry(
                    row["value"], row["revision"], row["created"], row["version"], None
                ), key
    # The log, each key's history, and every key at every revision.
    changes = state.changes(since=model.base, scope=scope.name)
    assert [(e.key, e.type, e.old_value, e.new_value, e.version, e.revision) for e in changes] == (
        model.log
    )
    for key in KEYS:
        history = scope.history(key)
        assert [(e.type, e.new_value, e.version, e.revision) for e in history] == [
            (t, new, ver, rev) for k, t, _, new, ver, rev in model.log if k == key
        ]
        if history:
            middle = history[len(history) // 2].revision
            assert [e.revision for e in scope.history(key, since=middle)] == [
                e.revision for e in history if e.revision > middle
            ]
            assert scope.history(key, limit=1) == history[:1]
    for revision in range(model.base, model.revision + 1):
        at = model.at[max(r for r in model.at if r <= revision)]
        for key in KEYS:
            assert scope.get(key, "-", at_revision=revision) == at.get(key, "-"), (revision, key)


def _apply(  # noqa: PLR0911
    scope: reactor.Scope, verb: str, key: str, rest: list[Any], cond: int | None
) -> Any:
    if verb == "set":
        return scope.set(key, rest[0], if_revision=cond)
    if verb == "delete":
        return scope.delete(key, if_revision=cond)
    if verb == "increment":
        return scope.increment(key, if_revision=cond)
    if verb == "push":
        return scope.push(key, rest[0], if_revision=cond)
    if verb == "pop":
        return scope.pop(key, front=rest[0], if_revision=cond)
    if verb == "cas":
        return scope.compare_and_swap(key, rest[0], rest[1], if_revision=cond)
    if verb == "expire":
        return scope.expire(key, None, if_revision=cond)
    raise AssertionError(verb)


def _expect(  # noqa: PLR0911
    model: _Model, verb: str, key: str, rest: list[Any], value: Any, exists: bool
) -> Any:
    """Apply ``verb`` to the model; what the verb returns."""
    if verb == "set":
        model.write(key, rest[0])
        return reactor.Change(value, rest[0])
    if verb == "delete":
        model.write(key, reactor.MISSING)
        return value
    if verb == "increment":
        new = (value if exists else 0) + 1
        model.write(key, new)
        return new
    if verb == "push":
        new = [*(value if exists else []), rest[0]]
        model.write(key, new)
        return len(new)
    if verb == "pop":
        if not exists or not value:
            return None
        items = list(value)
        item = items.pop(0 if rest[0] else -1)
        model.write(key, items)
        return item
    if verb == "cas":
        expected, new = rest
        matches = (not exists) if expected is reactor.MISSING else exists and value == expected
        if matches:
            model.write(key, new)
        return matches
    if verb == "expire":
        return exists
    raise AssertionError(verb)


def test_at_revision_after_a_deadline_whose_expiry_was_recorded_later(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC §3: 'From its deadline on, every read treats a key as absent'; §13:
    get(key, at_revision=R) 'returns the value the key had at revision R (default if
    absent then)'."""
    ttl_scope, other = state.scope("ttl"), state.scope("other")
    ttl_scope.set("k", "v", ttl=10)
    with ttl_scope.transaction():  # holds the sweeper off "ttl" while R commits
        clock.advance(20)  # k's deadline is past: it reads as absent from now on
        assert _elsewhere(lambda: ttl_scope.get("k", "gone")) == "gone"
        other.set("x", 1)
        revision = _last_revision(state)
    poll(lambda: [e.type for e in ttl_scope.history("k")] == ["created", "expired"])
    assert ttl_scope.history("k")[-1].revision > revision
    # At R the key was past its deadline: absent.
    assert ttl_scope.get("k", "gone", at_revision=revision) == "gone"


def test_versions_of_events_agree_with_entries_through_expiry(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC §13: ChangeEvent gains version; versions.md: '0 when the key was deleted or
    expired', 'a deleted key starts again at 1', TTL-only changes record nothing."""
    scope = state.scope("v")
    seen: list[tuple[str, int | None, int]] = []
    done = threading.Event()

    def on_change(event: reactor.ChangeEvent) -> None:
        seen.append((event.type, event.version, event.revision))
        if event.key == "end":
            done.set()

    state.subscribe(on_change, scope="v")
    scope.set("k", 1, ttl=5)
    first = scope.entry("k")
    assert first is not None
    assert first.version == 1
    assert first.expires_at == pytest.approx(clock.time() + 5)
    scope.expire("k", 50)  # TTL-only: no change recorded
    scope.set("k", 1, ttl=60)  # same value, new TTL: no change recorded
    again = scope.entry("k")
    assert again is not None
    assert (again.revision, again.version) == (first.revision, 1)
    assert again.expires_at == pytest.approx(clock.time() + 60)
    scope.increment("k")
    clock.advance(61)
    poll(lambda: scope.history("k")[-1].type == "expired")
    assert scope.entry("k") is None
    scope.set("k", 7)
    reborn = scope.entry("k")
    assert reborn is not None
    assert reborn.version == 1
    assert reborn.created_revision == reborn.revision > first.revision
    scope.set("end", 1)
    assert done.wait(PATIENCE)
    assert [(t, v) for t, v, _ in seen] == [
        ("created", 1),
        ("updated", 2),
        ("expired", 0),
        ("created", 1),
        ("created", 1),
    ]
    assert [r for *_, r in seen] == [e.revision for e in state.changes(scope="v")]


BAD_REVISIONS = [-1, True, 1.0, "1", 2**63, None]


def test_bad_revisions_are_refused_by_every_verb_and_change_nothing(state: reactor.State) -> None:
    """verbs.md: InvalidArgumentError for an if_revision, at_revision or since that is
    not an int >= 0; 'A verb that raises has changed nothing'."""
    scope = state.scope("s")
    scope.set_many({"k": 1, "l": [1], "t": "x"})
    scope.schedule("k", 5, after=100)
    before = (state.changes(), scope.list(), state.timers())
    for bad in BAD_REVISIONS[:-1]:
        _refuse_bad_revision(state, scope, bad)
    assert (state.changes(), scope.list(), state.timers()) == before


def _refuse_bad_revision(state: reactor.State, scope: reactor.Scope, bad: Any) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: scope.set("k", 2, if_revision=bad),
        lambda: scope.set_many({"k": 2}, if_revision=bad),
        lambda: scope.delete("k", if_revision=bad),
        lambda: scope.clear(if_revision=bad),
        lambda: scope.expire("k", 0, if_revision=bad),
        lambda: scope.increment("k", if_revision=bad),
        lambda: scope.decrement("k", if_revision=bad),
        lambda: scope.append("t", "y", if_revision=bad),
        lambda: scope.compare_and_swap("k", 1, 2, if_revision=bad),
        lambda: scope.push("l", 2, if_revision=bad),
        lambda: scope.pop("l", if_revision=bad),
        lambda: scope.update("k", [ops.set("", 3)], if_revision=bad),
        lambda: scope.get("k", at_revision=bad),
        lambda: scope.history("k", since=bad),
    ]
    if bad != 2**63:  # a limit has no upper bound
        calls.append(lambda: scope.history("k", limit=bad))
    for call in calls:
        with pytest.raises(reactor.InvalidArgumentError):
            call()
    with pytest.raises(reactor.InvalidArgumentError), scope.transaction() as tx:
        tx.set("k", 9)
        tx.set("k", 2, if_revision=bad)


def test_conditional_writes_inside_transactions_over_several_scopes(state: reactor.State) -> None:
    """versions.md: inside a transaction if_revision works 'against the scope as the
    body has changed it; a conflict there undoes only that write'; transactions.md:
    events of a transaction over several scopes follow 'in the order of the body's
    writes, with consecutive revisions'."""
    orders, ledger = state.scope("orders"), state.scope("ledger")
    orders.set("o-1", {"total": 1})
    ledger.set("revenue", 0)
    before = orders.entry("o-1")
    assert before is not None
    events: list[reactor.ChangeEvent] = []
    four = threading.Event()

    def on_change(event: reactor.ChangeEvent) -> None:
        events.append(event)
        if len(events) == 4:
            four.set()

    revenue_at = ledger.entry("revenue")
    assert revenue_at is not None
    state.subscribe(on_change, scope="[ol]*")
    with state.transaction("orders", "ledger") as tx:
        assert tx["orders"].entry("o-1") == before
        tx["ledger"].increment("revenue", 10, if_revision=revenue_at.revision)
        tx["orders"].set("o-1", {"total": 2}, if_revision=before.revision)
        mine = tx["orders"].entry("o-1")
        assert mine is not None
        assert mine.revision < 0
        assert mine.version == 2
        with pytest.raises(reactor.ConflictError):  # the body changed it: not at R any more
            tx["orders"].set("o-1", {"total": 3}, if_revision=before.revision)
        tx["orders"].set("o-2", {"total": 5}, if_revision=0)
        with pytest.raises(reactor.ConflictError):
            tx["orders"].set("o-2", {"total": 6}, if_revision=0)
        tx["ledger"].increment("revenue", 5)
    assert four.wait(PATIENCE)
    assert [(e.scope, e.key, e.new_value, e.version) for e in events] == [
        ("ledger", "revenue", 10, 2),
        ("orders", "o-1", {"total": 2}, 2),
        ("orders", "o-2", {"total": 5}, 1),
        ("ledger", "revenue", 15, 3),
    ]
    revisions = [e.revision for e in events]
    assert revisions == list(range(revisions[0], revisions[0] + 4))
    after = orders.entry("o-1")
    assert after is not None
    assert (after.revision, after.version, after.created_revision) == (
        revisions[1],
        2,
        before.created_revision,
    )
    revenue = ledger.entry("revenue")
    assert revenue is not None
    assert (revenue.revision, revenue.version) == (revisions[3], 3)


CLEAR_RACER = """
deadline = time.time() + float(sys.argv[2])
scope = state.scope("s")
n = 0
print("started", flush=True)
while time.time() < deadline:
    n += 1
    scope.set(f"k-{n % 3}", n)
    time.sleep(0.01)
state.close()
"""


def test_clear_if_revision_never_removes_a_key_changed_after_the_snapshot(db_path: Any) -> None:
    """versions.md: 'set_many and clear ... with if_revision=R apply only if none of
    the keys they write changed after R' — with another process writing at the worst
    moment."""
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        racer = _spawn(db_path, CLEAR_RACER, "2")
        try:
            assert racer.stdout is not None
            assert racer.stdout.readline().strip() == "started"
            applied = conflicts = 0
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                seen = scope.snapshot()
                try:
                    removed = scope.clear("k-*", if_revision=seen.revision)
                except reactor.ConflictError:
                    conflicts += 1
                    continue
                applied += 1
                after = state.changes(since=seen.revision, scope="s")
                deletions = [e for e in after if e.type == "deleted"][:removed]
                # What was removed is exactly what the snapshot saw.
                assert {e.key: e.old_value for e in deletions} == {
                    k: v for k, v in seen.values.items() if k.startswith("k-")
                }
        finally:
            racer.communicate(timeout=30)
        assert racer.returncode == 0
        assert applied > 0
        assert conflicts + applied > 5


# == history and compaction ===========================================================


def test_history_and_at_revision_at_the_compaction_horizon(
    open_state: Opener, clock: ManualClock
) -> None:
    """SPEC §13: RevisionCompactedError 'if the log no longer covers R'; nothing
    retained is lost; a revision still covered reads as it was."""
    state = open_state(clock=clock, log_retention=5)
    scope = state.scope("h")
    for n in range(12):
        scope.set("k", n)
    run_upkeep(state)
    horizon = state.changes(limit=1)[0].revision - 1  # what the log no longer covers
    last = _last_revision(state)
    assert 0 < horizon < last
    retained = scope.history("k")
    assert [e.revision for e in retained] == list(range(horizon + 1, last + 1))
    assert scope.history("k", since=horizon) == retained
    with pytest.raises(reactor.RevisionCompactedError):
        scope.history("k", since=horizon - 1)
    assert scope.get("k", at_revision=horizon) == retained[0].old_value
    with pytest.raises(reactor.RevisionCompactedError):
        scope.get("k", at_revision=horizon - 1)
    for event in retained:
        assert scope.get("k", at_revision=event.revision) == event.new_value
    with pytest.raises(reactor.InvalidArgumentError):
        scope.get("k", at_revision=last + 1)
    # if_revision compares the row: compaction does not change what it means.
    entry = scope.entry("k")
    assert entry is not None
    scope.set("k", "after", if_revision=entry.revision)


def test_history_is_never_silently_gapped_by_a_compaction_between_pages(
    state: reactor.State, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §13 history 'returns the retained events of one key, oldest first'; §7 'a
    replay is never silently gapped'. A compaction (the background compactor's work,
    run every 2 s) is made to happen between the first and second page of the read."""
    scope = state.scope("h")
    with scope.transaction() as tx:
        for n in range(2500):
            tx.set("k", n)
    first = scope.history("k", limit=1)[0].revision
    engine = engine_of(state)
    store = engine.store
    original = store.key_history
    pages = itertools.count()

    def key_history(*args: Any) -> Any:
        found = original(*args)
        if next(pages) == 0:  # compact what a retention of the last 1000 events drops
            engine.commit(lambda txn: txn.statements.compact(first + 1499, None))
        return found

    monkeypatch.setattr(store, "key_history", key_history)
    try:
        history = scope.history("k")
    except reactor.RevisionCompactedError:
        return  # acceptable: not silent
    revisions = [e.revision for e in history]
    assert revisions == list(range(revisions[0], revisions[0] + len(revisions))), (
        f"gapped: {len(revisions)} events from {revisions[0]} to {revisions[-1]}"
    )


# == waiting ==========================================================================

BURST = """
scope = state.scope("w")
for n in range(int(sys.argv[2])):
    scope.set("k", n)
"""


def test_wait_for_sees_a_transient_value_of_a_burst_from_another_process(db_path: Any) -> None:
    """waiting.md: 'A value the key holds only for a moment ... satisfies a predicate
    that looks for it, even if the next change follows at once', 'including other
    processes' changes'."""
    with reactor.open(db_path) as state:
        scope = state.scope("w")
        scope.set("k", -1)
        found: list[Any] = []
        started = threading.Event()

        def predicate(value: Any) -> bool:
            started.set()
            return value == 137

        waiter = threading.Thread(
            target=lambda: found.append(scope.wait_for("k", predicate, timeout=30))
        )
        waiter.start()
        assert started.wait(PATIENCE)
        _in_other_process(db_path, BURST, "200")
        waiter.join(40)
        assert found == [137]
        assert scope.get("k") == 199


def test_close_right_after_a_satisfying_write_returns_the_value_repeatedly(db_path: Any) -> None:
    """waiting.md: changes committed before the close are delivered first; the wait
    returns their value (no monkeypatching: real races, 15 rounds)."""
    for round_ in range(15):
        state = reactor.open(db_path)
        scope = state.scope("w")
        scope.set("k", round_ * 10)
        thread, outcome = _waiting_in_thread(scope, "k", round_ * 10 + 5)
        for n in range(1, 6):
            scope.set("k", round_ * 10 + n)
        state.close()
        thread.join(PATIENCE)
        assert outcome == [round_ * 10 + 5], round_


def test_closing_one_of_two_handles_does_not_end_a_wait_on_the_other(open_state: Opener) -> None:
    """SPEC §1: the engine stops when its last handle closes; waiting.md: closing the
    engine (its last handle) ends every wait."""
    first, second = open_state(), open_state()
    scope = second.scope("w")
    scope.set("k", "pending")
    thread, outcome = _waiting_in_thread(scope, "k", "done")
    first.close()
    time.sleep(0.1)
    assert outcome == []
    scope.set("k", "done")
    thread.join(PATIENCE)
    assert outcome == ["done"]


def test_wait_for_in_a_subscription_callback_and_woken_by_a_timer(
    state: reactor.State, clock: ManualClock
) -> None:
    """waiting.md: 'A subscription's callback runs on a thread of its own and may
    wait'; timers.md: a timer's write is an ordinary write (it wakes waiters)."""
    steps = state.scope("steps")
    results: list[Any] = []
    done = threading.Event()

    def on_start(event: reactor.ChangeEvent) -> None:
        results.append(steps.wait_for("approved", lambda v: v is True, timeout=PATIENCE))
        steps.set("finished", event.new_value)
        done.set()

    state.subscribe(on_start, scope="steps", key="start")
    steps.schedule("approved", True, after=30)
    steps.set("start", "job-1")
    time.sleep(0.3)
    assert not done.is_set()
    clock.advance(31)
    assert done.wait(PATIENCE)
    assert results == [True]
    assert steps.get("finished") == "job-1"


def test_a_slow_predicate_holds_up_no_writer_or_subscriber(state: reactor.State) -> None:
    """waiting.md: 'The predicate runs in the thread that called wait_for ... a slow
    predicate holds up no one else'."""
    scope = state.scope("w")
    release = threading.Event()
    seen: list[int] = []
    all_seen = threading.Event()

    def slow(value: Any) -> bool:
        release.wait(PATIENCE)
        return value == 99

    def on_change(event: reactor.ChangeEvent) -> None:
        seen.append(event.new_value)
        if event.new_value == 99:
            all_seen.set()

    state.subscribe(on_change, scope="w")
    scope.set("k", 0)
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(scope.wait_for("k", slow, timeout=30)))
    thread.start()
    started = time.monotonic()
    for n in range(1, 100):
        scope.set("k", n)
    assert all_seen.wait(PATIENCE)
    assert time.monotonic() - started < 5
    assert seen == list(range(100))
    release.set()
    thread.join(30)
    assert found == [99]


def test_timeout_zero_looks_without_waiting(state: reactor.State) -> None:
    """waiting.md: 'timeout=0 looks at the current value and the changes already
    delivered, without waiting'."""
    scope = state.scope("w")
    started = time.monotonic()
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("k", timeout=0)
    scope.set("k", None)
    assert scope.wait_for("k", timeout=0) is None  # JSON null exists
    with pytest.raises(reactor.OperationTimeout):
        scope.wait_for("k", lambda v: v is not None, timeout=0)
    assert time.monotonic() - started < 2


BAD_WAITS: list[tuple[Callable[[reactor.Scope], Any], type[Exception]]] = [
    (lambda s: s.wait_for("", timeout=0), reactor.InvalidKeyError),
    (lambda s: s.wait_for(5, timeout=0), reactor.InvalidKeyError),
    (lambda s: s.wait_for("k", "done", timeout=0), reactor.InvalidArgumentError),
    (lambda s: s.wait_for("k", timeout=-1), reactor.InvalidArgumentError),
    (lambda s: s.wait_for("k", timeout=True), reactor.InvalidArgumentError),
    (lambda s: s.wait_for("k", timeout="1"), reactor.InvalidArgumentError),
    (lambda s: s.wait_for("k", timeout=float("nan")), reactor.InvalidArgumentError),
]


def test_bad_wait_arguments_are_refused(state: reactor.State) -> None:
    """verbs.md wait_for: InvalidArgumentError (predicate not callable, bad timeout),
    InvalidKeyError for a bad key."""
    for call, error in BAD_WAITS:
        with pytest.raises(error):
            call(state.scope("w"))
        assert engine_of(state).hub.listeners() == []  # nothing left listening


async def test_async_waits_cancelled_in_a_storm_leave_nothing_behind(db_path: Any) -> None:
    """waiting.md: 'Cancelling the task (or asyncio.wait_for(..., timeout) around it)
    ends the wait'."""
    async with reactor.aio.open(db_path) as state:
        scope = state.scope("w")
        early = [asyncio.create_task(scope.wait_for("k0")) for _ in range(50)]
        await asyncio.sleep(0)
        for task in early:  # cancelled while they start (their read runs in a thread)
            task.cancel()
        tasks = [asyncio.create_task(scope.wait_for(f"k{n % 7}")) for n in range(200)]
        await asyncio.sleep(0.05)
        for task in tasks[::2]:
            task.cancel()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(scope.wait_for("k0", lambda v: v == "never"), 0.2)
        for n in range(7):
            await scope.set(f"k{n}", n)
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), PATIENCE)
        assert sum(isinstance(r, asyncio.CancelledError) for r in done) == 100
        assert [r for r in done if not isinstance(r, asyncio.CancelledError)] == [
            n % 7 for n in range(1, 200, 2)
        ]
        sync = state._link.state
        assert sync is not None
        poll(lambda: engine_of(sync).hub.listeners() == [])


# == timers ===========================================================================


def test_timers_of_a_free_scope_fire_while_another_scope_with_many_due_timers_is_held(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC §13: a timer's write is applied 'within one second of its due time' (and
    §3 promises the same of expiry 'while other scopes run long transactions')."""
    held, free = state.scope("held"), state.scope("free")
    with held.transaction() as tx:
        for n in range(1000):
            tx.schedule(f"k{n}", n, after=10)
    free.schedule("f", "fired", after=20)
    with held.transaction():
        clock.advance(30)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline and free.get("f") is None:
            time.sleep(0.05)
        fired_while_held = free.get("f")
    poll(lambda: state.timers() == [], timeout=PATIENCE)
    assert fired_while_held == "fired"


def test_a_timer_is_cancelled_inside_a_transaction_atomically(open_state: Opener) -> None:
    """SPEC §13: 'Timers are created and cancelled inside transactions too
    (tx.schedule), atomically with the transaction'; SPEC §5: a call that would wait on
    the body itself raises ReentrancyError instead of deadlocking."""
    state = open_state(timeout=1)
    scope = state.scope("orders")
    timer = scope.schedule("o-1", "cancelled", after=600)

    def cancel(tx: reactor.Transaction) -> bool:
        own = getattr(tx, "cancel_timer", None)
        return own(timer.id) if own is not None else state.cancel_timer(timer.id)

    with pytest.raises(RuntimeError), scope.transaction() as tx:
        tx.set("o-1", "paid")
        assert cancel(tx) is True
        raise RuntimeError("rolled back")
    assert state.timers() == [timer]  # the body raised: still pending
    with scope.transaction() as tx:
        tx.set("o-1", "paid")
        assert cancel(tx) is True
    assert state.timers() == []
    assert scope.get("o-1") == "paid"


def test_a_timers_write_is_an_ordinary_write(state: reactor.State, clock: ManualClock) -> None:
    """timers.md: 'value (as set(key, value) would, which drops an expiry), or ops ...
    (as update(key, ops) would)'; 'the same result and the same change event as if it
    were called then, and the event's timer is the timer's id'."""
    scope = state.scope("t")
    scope.set("v", "old", ttl=1000)
    scope.set("o", {"n": 1}, ttl=1000)
    scope.set("same", 5)
    events: list[reactor.ChangeEvent] = []
    state.subscribe(events.append, scope="t")
    by_value = scope.schedule("v", "new", after=5)
    by_ops = scope.schedule("o", ops=[ops.increment("n")], after=5)
    patch = scope.schedule("p", ops=[{"op": "add", "path": "", "value": [1]}], after=5)
    no_change = scope.schedule("same", 5, after=5)
    clock.advance(6)
    poll(lambda: state.timers() == [] and len(events) == 3)
    assert scope.ttl("v") == -1.0  # set drops the expiry
    assert scope.ttl("o") == pytest.approx(1000 - 6)  # update keeps it
    assert scope.get("o") == {"n": 2}
    assert scope.get("p") == [1]
    got = {e.key: (e.type, e.old_value, e.new_value, e.version, e.timer) for e in events}
    assert got == {
        "v": ("updated", "old", "new", 2, by_value.id),
        "o": ("updated", {"n": 1}, {"n": 2}, 2, by_ops.id),
        "p": ("created", None, [1], 1, patch.id),
    }
    assert scope.history("same")[-1].timer is None  # the same value: no change at all
    assert no_change.id not in {e.timer for e in state.changes()}
    assert [e.timer for e in scope.history("o")] == [None, by_ops.id]


def test_a_recurring_timer_whose_write_fails_keeps_its_period(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC §13: 'A timer whose write fails (a type mismatch) is recorded in stats()
    and dropped (recurring: the next period still fires)'; 'missed several periods
    fires once and then keeps its period'."""
    scope = state.scope("t")
    scope.set("n", "text")
    beat = scope.schedule("n", ops=[ops.increment("")], every=10)
    assert beat.due == clock.time() + 10
    clock.advance(35)  # three periods missed
    poll(lambda: state.stats()["timers"]["failed"] == 1)
    assert state.timers()[0].due == beat.due + 30  # keeps its phase
    assert scope.get("n") == "text"
    scope.set("n", 0)
    clock.advance(10)
    poll(lambda: scope.get("n") == 1)
    time.sleep(0.6)  # the sweeper looks again and again: no second firing
    assert scope.get("n") == 1
    assert state.stats()["timers"]["failed"] == 1
    assert state.stats()["timers"]["fired"] == 2
    assert state.timers()[0].due == beat.due + 40


def test_a_recurring_timer_at_a_time_in_the_past_fires_once_and_keeps_its_phase(
    state: reactor.State, clock: ManualClock
) -> None:
    """timers.md: 'at an epoch time (a time in the past fires at once)', 'keeps its
    period from its first due time'."""
    scope = state.scope("t")
    start = clock.time() - 95
    scope.schedule("n", ops=[ops.increment("")], at=start, every=10)
    poll(lambda: scope.get("n") == 1)
    time.sleep(0.5)
    assert scope.get("n") == 1
    assert state.timers()[0].due == start + 100


@pytest.mark.parametrize(
    ("due", "every"),
    [({"after": 0.1}, None), ({"at": 1_700_000_123.456789}, None), ({"after": 1e-3}, 0.3)],
)
def test_a_timer_lists_as_it_was_returned(
    state: reactor.State, due: dict[str, float], every: float | None
) -> None:
    """timers.md: assert state.timers("payments") == [timeout] (both backends)."""
    timer = state.scope("x").schedule("k", 1, every=every, **due)
    assert state.timers("x") == [timer]
    assert state.timers("[!x]*") == []


BAD_TIMERS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"key": "k"}, reactor.InvalidArgumentError),  # no value, no ops
    ({"key": "k", "value": 1}, reactor.InvalidArgumentError),  # no time
    ({"key": "k", "value": 1, "ops": [], "after": 1}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "after": 1, "at": 2}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "after": float("nan")}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "after": float("inf")}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "after": True}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "after": "1"}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "at": "soon"}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "every": 0}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "every": -1}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "every": float("inf")}, reactor.InvalidArgumentError),
    ({"key": "k", "value": 1, "every": True}, reactor.InvalidArgumentError),
    ({"key": "", "value": 1, "after": 1}, reactor.InvalidKeyError),
    ({"key": 7, "value": 1, "after": 1}, reactor.InvalidKeyError),
    ({"key": "k", "value": float("nan"), "after": 1}, reactor.InvalidValueError),
    ({"key": "k", "value": {1: 2}, "after": 1}, reactor.InvalidValueError),
    ({"key": "k", "value": "x" * 2000, "after": 1}, reactor.InvalidValueError),
    ({"key": "k", "ops": "inc", "after": 1}, reactor.InvalidOpError),
    ({"key": "k", "ops": [1], "after": 1}, reactor.InvalidOpError),
    (
        {"key": "k", "ops": [ops.increment("n"), {"op": "remove", "path": ""}], "after": 1},
        reactor.InvalidOpError,
    ),
    ({"key": "k", "ops": [ops.set("a", float("nan"))], "after": 1}, reactor.InvalidValueError),
]


def test_a_bad_timer_is_refused_with_its_typed_error_and_changes_nothing(
    open_state: Opener, clock: ManualClock
) -> None:
    """verbs.md schedule: InvalidArgumentError, InvalidValueError, InvalidOpError;
    'A verb that raises has changed nothing' — also inside a transaction."""
    state = open_state(clock=clock, max_value_bytes=1000)
    scope = state.scope("t")
    scope.set("k", 0)
    for n, (case, error) in enumerate(BAD_TIMERS):
        kwargs = dict(case)
        before = (state.changes(), state.timers())
        key = kwargs.pop("key")
        with pytest.raises(error):
            scope.schedule(key, **kwargs)
        with scope.transaction() as tx:
            tx.set("k", n + 1)
            with pytest.raises(error):
                tx.schedule(key, **kwargs)
        assert state.timers() == before[1] == [], case
        assert [e.key for e in state.changes()] == [*(e.key for e in before[0]), "k"], case
    with pytest.raises(reactor.InvalidArgumentError):
        state.cancel_timer(None)  # type: ignore[arg-type]
    with pytest.raises(reactor.InvalidKeyError):
        state.timers("")
    assert state.cancel_timer("no-such-timer") is False


def test_timers_in_transactions_are_atomic_with_the_body(state: reactor.State) -> None:
    """timers.md: 'tx.schedule(...) ... creates the timer with the commit, or not at
    all'; transactions.md: 'a verb that fails inside the body ... undoes only itself'."""
    a, b = state.scope("a"), state.scope("b")
    a.set("text", "x")
    with a.transaction() as tx:
        kept = tx.schedule("k", 1, after=100)
        with pytest.raises(reactor.TypeMismatchError):
            tx.increment("text")
        assert _elsewhere(state.timers) == []  # not before the commit
    assert state.timers() == [kept]
    with pytest.raises(RuntimeError), state.transaction("a", "b") as multi:
        multi["b"].schedule("k", 2, after=100)
        multi["a"].set("x", 1)
        raise RuntimeError("no")
    assert state.timers() == [kept]
    with state.transaction("b", "a") as multi:
        in_b = multi["b"].schedule("k", 2, after=50)
    assert state.timers() == [in_b, kept]
    assert b.get("k") is None


def test_close_racing_due_timers_fires_each_exactly_once(db_path: Any) -> None:
    """SPEC §13: 'applied exactly once', 'A timer that came due while no engine was open
    fires at the next open' — with close() racing the firing."""
    count = 0
    for delay in (0.0, 0.02, 0.1, 0.3):
        with reactor.open(db_path) as state:
            for s in range(8):
                with state.scope(f"s{s}").transaction() as tx:
                    for n in range(40):
                        tx.schedule(f"k{n % 4}", ops=[ops.increment("")], at=0)
                        count += 1
            time.sleep(delay)
    with reactor.open(db_path) as state:
        poll(lambda: state.timers() == [], timeout=PATIENCE)
        total = sum(state.scope(f"s{s}").get(f"k{n}", 0) for s in range(8) for n in range(4))
        fired = [e.timer for e in state.changes() if e.timer is not None]
        assert len(fired) == len(set(fired)) == total == count


KILLED_WHILE_FIRING = """
print("open", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kill_after", [0.05, pytest.param(0.15, marks=pytest.mark.slow)])
def test_a_process_killed_while_firing_timers_fires_none_twice(
    db_path: Any, kill_after: float
) -> None:
    """SPEC §13 'exactly once ... by exactly one process'; §8 'survives the process
    being killed at any moment' — kill -9 in the middle of firing 2000 due timers."""
    count = 2000
    with reactor.open(db_path) as state:
        for s in range(20):
            with state.scope(f"s{s}").transaction() as tx:
                for n in range(count // 20):
                    tx.schedule(f"k{n % 3}", ops=[ops.increment("")], after=0.3)
    dying = _spawn(db_path, KILLED_WHILE_FIRING)
    try:
        assert dying.stdout is not None
        assert dying.stdout.readline().strip() == "open"
        time.sleep(0.3 + kill_after)
        dying.send_signal(signal.SIGKILL)
    finally:
        if dying.poll() is None:
            os.kill(dying.pid, signal.SIGKILL)
        dying.communicate(timeout=30)
    with reactor.open(db_path) as state:
        poll(lambda: state.timers() == [], timeout=PATIENCE)
        total = sum(state.scope(f"s{s}").get(f"k{n}", 0) for s in range(20) for n in range(3))
        fired = [e.timer for e in state.changes() if e.timer is not None]
        assert len(fired) == len(set(fired)) == total == count


def test_cancelling_a_recurring_timer_from_its_own_event(
    state: reactor.State, clock: ManualClock
) -> None:
    """A workflow: a subscriber reacts to a timer's event and cancels it (SPEC §7 'A
    subscriber may read and write state from its callback')."""
    scope = state.scope("t")
    beat = scope.schedule("n", ops=[ops.increment("")], every=10)
    answers: list[bool] = []

    def on_change(event: reactor.ChangeEvent) -> None:
        if event.timer == beat.id and event.new_value == 2:
            answers.append(state.cancel_timer(beat.id))

    state.subscribe(on_change, scope="t")
    for _ in range(4):
        clock.advance(10)
        time.sleep(0.35)
    poll(lambda: answers == [True])
    assert scope.get("n") == 2
    assert state.timers() == []


# == transactions over several scopes =================================================


@pytest.mark.parametrize("max_actors", [1, 2, 64])
def test_random_orders_of_overlapping_transactions_never_deadlock_or_lose(
    open_state: Opener, max_actors: int
) -> None:
    """transactions.md: 'Two transactions that share scopes, named in any order, in any
    threads, take turns and never wait for each other in a circle'; commit together —
    with scopes sharing actors, plain writers and waiters on the same scopes."""
    state = open_state(max_actors=max_actors, timeout=20)
    names = ["s0", "s1", "s2", "s3"]
    for name in names:
        state.scope(name).set("balance", 100)
    errors: list[BaseException] = []
    moved = [0]

    def transfers(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(25):
                chosen = rng.sample(names, rng.choice([2, 3, 4]))
                rng.shuffle(chosen)
                with state.transaction(*chosen) as tx:
                    source, target = chosen[0], chosen[-1]
                    tx[source].decrement("balance", 3)
                    tx[target].increment("balance", 3)
                    tx[chosen[1]].increment("touched")
        except BaseException as exc:
            errors.append(exc)

    def plain() -> None:
        try:
            for n in range(60):
                state.scope(names[n % 4]).increment("plain")
                moved[0] += 1
        except BaseException as exc:
            errors.append(exc)

    def waiter() -> None:
        try:
            state.scope("s2").wait_for("plain", lambda v: v >= 15, timeout=20)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=transfers, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=plain), threading.Thread(target=waiter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert sum(state.scope(name).get("balance") for name in names) == 400
    assert sum(state.scope(name).get("touched", 0) for name in names) == 100
    assert sum(state.scope(name).get("plain", 0) for name in names) == 60


TTL_ONLY = """
state.scope(sys.argv[2]).expire(sys.argv[3], 1000)
"""


@pytest.mark.parametrize("read_it", [True, False])
def test_a_ttl_only_change_by_another_process_during_a_multi_transaction(
    db_path: Any, read_it: bool
) -> None:
    """SPEC §3: 'A TTL-only change ... is a write like any other: a concurrent
    transaction in another process either keeps it or fails with ConflictError'."""
    with reactor.open(db_path) as state:
        a = state.scope("a")
        a.set("k", 1, ttl=100)
        a.set("j", 1, ttl=100)
        try:
            with state.transaction("a", "b") as tx:
                if read_it:
                    tx["a"].increment("k")  # reads k's expiry, and writes it back
                else:
                    tx["a"].increment("j")
                tx["b"].set("x", 1)
                _in_other_process(db_path, TTL_ONLY, "a", "k")
        except reactor.ConflictError:
            assert state.scope("b").get("x") is None
            assert a.get("k") == 1
        assert a.ttl("k") > 900  # the other process's change is kept


BAD_TRANSACTIONS: list[tuple[Callable[[reactor.State], Any], type[Exception]]] = [
    (lambda s: s.transaction(), reactor.InvalidArgumentError),
    (lambda s: s.transaction("a", ""), reactor.InvalidKeyError),
    (lambda s: s.transaction("a", 5), reactor.InvalidKeyError),
    (lambda s: s.transaction("a", None), reactor.InvalidKeyError),
    (lambda s: s.transaction("a", "x" * 1025), reactor.InvalidKeyError),
    (lambda s: s.transaction("a", "b")["c"], reactor.InvalidArgumentError),
    (lambda s: s.transaction("a", "b")[5], reactor.InvalidKeyError),
]


def test_bad_transactions_are_refused(state: reactor.State) -> None:
    """transactions.md: 'Mistakes are refused'."""
    for make, error in BAD_TRANSACTIONS:
        with pytest.raises(error):
            make(state)
    assert state.changes() == []


def test_mistakes_inside_a_multi_transaction_are_refused_and_change_nothing(
    state: reactor.State,
) -> None:
    """transactions.md: a plain handle of a held scope, a transaction naming a held
    scope, tx[name].transaction(), and a MultiTransaction entered twice raise."""
    with state.transaction("a", "b", "a") as tx:
        assert tx.names == ("a", "b")
        tx["a"].set("k", 1)
        with pytest.raises(reactor.ReentrancyError):
            state.scope("b").get("k")
        with pytest.raises(reactor.ReentrancyError):
            state.scope("a").wait_for("k", timeout=0)
        with pytest.raises(reactor.ReentrancyError):
            state.transaction("c", "b")
        with pytest.raises(reactor.ReentrancyError):
            tx["a"].transaction()
        with pytest.raises(reactor.ReentrancyError):
            tx.__enter__()
        with state.transaction("c") as inner:  # another scope: allowed, commits at once
            inner["c"].set("k", 1)
        assert _elsewhere(lambda: state.scope("c").get("k")) == 1
        assert _elsewhere(lambda: state.scope("a").get("k")) is None
    with pytest.raises(reactor.ClosedError):
        tx["a"].get("k")
    assert state.scope("a").get("k") == 1


async def test_async_a_task_cancelled_inside_the_body_commits_nothing_and_hands_back(
    db_path: Any,
) -> None:
    """transactions.md: if the body raises (a cancellation too) nothing of it is
    written, in any scope, and the scopes go back."""
    async with reactor.aio.open(db_path, timeout=5) as state:
        inside = asyncio.Event()

        async def body() -> None:
            async with state.transaction("a", "b") as tx:
                await tx["a"].set("k", 1)
                await tx["b"].set("k", 1)
                await tx["a"].schedule("t", 1, after=100)
                inside.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await asyncio.wait_for(inside.wait(), PATIENCE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.monotonic()
        await state.scope("a").set("after", 1)
        await state.scope("b").set("after", 1)
        assert time.monotonic() - started < 2
        assert await state.scope("a").get("k") is None
        assert await state.scope("b").get("k") is None
        assert await state.timers() == []


CONFLICT_WRITER = """
state.scope(sys.argv[2]).set("from-other", 1)
"""


def test_a_conflicting_multi_transaction_leaves_no_timer_no_event_no_version(
    db_path: Any,
) -> None:
    """transactions.md: another process commits to a scope the body only read ->
    ConflictError, nothing applied; timers.md: a commit that meets a ConflictError
    leaves no timer behind."""
    with reactor.open(db_path) as state:
        state.scope("b").set("seen", 1)
        events: list[reactor.ChangeEvent] = []
        state.subscribe(events.append, scope="a")
        with pytest.raises(reactor.ConflictError), state.transaction("a", "b") as tx:
            tx["b"].get("seen")
            tx["a"].set("k", 1)
            tx["a"].schedule("k", 2, after=100)
            _in_other_process(db_path, CONFLICT_WRITER, "b")
        assert state.timers() == []
        assert state.scope("a").entry("k") is None
        state.scope("a").set("k", 5)
        entry = state.scope("a").entry("k")
        assert entry is not None
        assert entry.version == 1
        poll(lambda: len(events) == 1)
        assert [(e.key, e.new_value) for e in events] == [("k", 5)]


@pytest.mark.parametrize("when", [{"after": 10**400}, {"at": 10**400}, {"at": -(10**400)}])
def test_a_huge_int_time_is_refused_with_the_typed_error(
    state: reactor.State, when: dict[str, int]
) -> None:
    """verbs.md schedule: 'InvalidArgumentError: ... a number not finite'; verbs.md: 'A
    verb that raises has changed nothing' (and raises a typed error)."""
    with pytest.raises(reactor.InvalidArgumentError):
        state.scope("t").schedule("k", 1, **when)
    assert state.timers() == []


def test_one_odd_recurring_timer_does_not_keep_the_other_timers_of_its_scope_from_firing(
    state: reactor.State, clock: ManualClock
) -> None:
    """SPEC §13: each timer fires 'within one second of its due time'; a period is
    accepted when it is > 0 (verbs.md), so one such timer must not stop the others."""
    scope = state.scope("t")
    with contextlib.suppress(reactor.InvalidArgumentError):  # refusing it is fine too
        scope.schedule("odd", ops=[ops.increment("")], at=0, every=1e-300)
    scope.schedule("k", "fired", after=1)
    clock.advance(2)
    poll(lambda: scope.get("k") == "fired", timeout=3)
