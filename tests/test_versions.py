"""Versions, conditional writes, a key's history and its value at a revision (SPEC §13)."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reactor
import reactor.aio
from reactor import ops
from reactor.testing import ManualClock
from tests.conftest import engine_of

# -- versions -------------------------------------------------------------------------


def test_an_entry_carries_revisions_and_version(state: reactor.State) -> None:
    scope = state.scope("s")
    assert scope.entry("k") is None
    scope.set("k", 1)
    first = scope.entry("k")
    assert first is not None
    assert (first.value, first.version, first.expires_at) == (1, 1, None)
    assert first.revision == first.created_revision == state.changes()[-1].revision
    scope.increment("k")
    scope.update("k", [{"op": "replace", "path": "", "value": 5}])
    second = scope.entry("k")
    assert second is not None
    assert (second.value, second.version, second.created_revision) == (5, 3, first.revision)
    assert second.revision == state.changes()[-1].revision
    scope.delete("k")
    assert scope.entry("k") is None
    scope.set("k", "again")
    again = scope.entry("k")
    assert again is not None
    assert again.version == 1
    assert again.created_revision == again.revision > second.revision


def test_a_write_that_changes_nothing_keeps_revision_and_version(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    scope.set("k", {"a": 1})
    before = scope.entry("k")
    scope.set("k", {"a": 1})  # the same value: no change recorded
    scope.expire("k", 60)  # a new deadline alone: no change recorded either
    after = scope.entry("k")
    assert before is not None
    assert after is not None
    assert (after.revision, after.version) == (before.revision, before.version)
    assert after.expires_at == pytest.approx(clock.time() + 60)


def test_events_carry_the_version_after_the_change(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    scope.set("k", 1)
    scope.set("k", 2)
    scope.delete("k")
    scope.set("k", 3, ttl=1)
    clock.advance(2)
    assert scope.get("k") is None  # a read does not record the expiry; the sweeper does
    scope.set("j", 0)
    scope.expire("j", 0)
    versions = [(event.key, event.type, event.version) for event in state.changes()]
    assert versions == [
        ("k", "created", 1),
        ("k", "updated", 2),
        ("k", "deleted", 0),
        ("k", "created", 1),
        ("j", "created", 1),
        ("j", "expired", 0),
    ]
    assert all(event.as_dict()["version"] == event.version for event in state.changes())
    assert state.changes()[0].timer is None


def test_a_transaction_gives_its_keys_versions_at_commit(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("old", 1)
    with scope.transaction() as tx:
        tx.set("new", 1)
        tx.set("new", 2)
        tx.increment("old")
        pending = tx.entry("new")
        assert pending is not None
        assert pending.revision < 0
        assert pending.version == 2
        with pytest.raises(reactor.InvalidArgumentError):
            tx.set("new", 3, if_revision=pending.revision)  # provisional: not a revision
    new, old = scope.entry("new"), scope.entry("old")
    assert new is not None
    assert old is not None
    revisions = [event.revision for event in state.changes()]
    assert (new.version, new.created_revision, new.revision) == (2, revisions[1], revisions[2])
    assert (old.version, old.revision) == (2, revisions[3])


# -- if_revision ----------------------------------------------------------------------

# Each verb, as a call with if_revision, on a key "k" holding [1, 2] or {"n": 1}-like data.
VERBS: dict[str, Callable[[reactor.Scope, int], Any]] = {
    "set": lambda s, r: s.set("k", [9], if_revision=r),
    "delete": lambda s, r: s.delete("k", if_revision=r),
    "expire": lambda s, r: s.expire("k", 30, if_revision=r),
    "push": lambda s, r: s.push("k", 3, if_revision=r),
    "pop": lambda s, r: s.pop("k", if_revision=r),
    "update": lambda s, r: s.update("k", [ops.append(3)], if_revision=r),
    "compare_and_swap": lambda s, r: s.compare_and_swap("k", [1, 2], [0], if_revision=r),
    "set_many": lambda s, r: s.set_many({"k": [9], "other": 1}, if_revision=r),
    "clear": lambda s, r: s.clear("k*", if_revision=r),
}
NUMBER_VERBS: dict[str, Callable[[reactor.Scope, int], Any]] = {
    "increment": lambda s, r: s.increment("k", if_revision=r),
    "decrement": lambda s, r: s.decrement("k", 2, if_revision=r),
    "append": lambda s, r: s.append("k", "!", if_revision=r),
}


def _fill(scope: reactor.Scope, verb: str) -> None:
    if verb == "append":
        scope.set("k", "text")
    elif verb in NUMBER_VERBS:
        scope.set("k", 10)
    else:
        scope.set("k", [1, 2])


@pytest.mark.parametrize("verb", [*VERBS, *NUMBER_VERBS])
def test_every_write_verb_applies_only_at_the_revision_given(
    state: reactor.State, verb: str
) -> None:
    call = {**VERBS, **NUMBER_VERBS}[verb]
    scope = state.scope("s")
    _fill(scope, verb)
    entry = scope.entry("k")
    assert entry is not None
    scope.set("unrelated", 1)  # another key's change moves the database, not "k"
    snapshot = scope.snapshot()
    scope.set("k", scope.get("k"))  # the same value: "k" stays at its revision
    stale = entry.revision - 1
    events = len(state.changes())
    with pytest.raises(reactor.ConflictError):
        call(scope, stale)
    with pytest.raises(reactor.ConflictError):
        call(scope, 0)  # 0: only if it does not exist
    assert (scope.list(), scope.ttl("k")) == (snapshot.values, -1)  # nothing written
    assert len(state.changes()) == events  # and no event
    if verb in {"set_many", "clear"}:
        # A write of several keys: none of them changed after the revision given.
        call(scope, snapshot.revision)
    else:
        call(scope, entry.revision)
    assert (scope.list(), scope.ttl("k")) != (snapshot.values, -1)


def test_if_revision_zero_creates_only(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("k", 1, if_revision=0)
    with pytest.raises(reactor.ConflictError):
        scope.set("k", 2, if_revision=0)
    assert scope.get("k") == 1
    assert scope.delete("absent", if_revision=0) is None
    scope.set_many({"a": 1, "b": 2}, if_revision=0)
    with pytest.raises(reactor.ConflictError):
        scope.set_many({"b": 3, "c": 3}, if_revision=0)
    assert scope.list() == {"a": 1, "b": 2, "k": 1}


def test_a_key_deleted_after_the_revision_is_a_conflict_for_several_keys(
    state: reactor.State,
) -> None:
    scope = state.scope("s")
    scope.set_many({"a": 1, "b": 2})
    seen = scope.snapshot()
    scope.delete("b")  # gone: no row says so, the change log does
    with pytest.raises(reactor.ConflictError):
        scope.set_many({"a": 5, "b": 5}, if_revision=seen.revision)
    with pytest.raises(reactor.ConflictError):
        scope.clear("*", if_revision=seen.revision)
    assert scope.list() == {"a": 1}
    scope.set("other-scope-key", 1)
    assert scope.clear("a*", if_revision=state.changes()[-1].revision) == 1


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1", 2**63])
def test_a_bad_if_revision_is_refused_before_anything(state: reactor.State, bad: Any) -> None:
    scope = state.scope("s")
    with pytest.raises(reactor.InvalidArgumentError):
        scope.set("k", 1, if_revision=bad)
    with pytest.raises(reactor.InvalidArgumentError):
        scope.set_many({"k": 1}, if_revision=bad)
    with pytest.raises(reactor.InvalidArgumentError):
        scope.get("k", at_revision=bad)
    assert scope.list() == {}


def test_an_expired_key_is_absent_for_if_revision(state: reactor.State, clock: ManualClock) -> None:
    scope = state.scope("s")
    scope.set("k", 1, ttl=5)
    entry = scope.entry("k")
    assert entry is not None
    assert entry.expires_at == pytest.approx(clock.time() + 5)
    clock.advance(6)
    with pytest.raises(reactor.ConflictError):
        scope.set("k", 2, if_revision=entry.revision)
    scope.set("k", 2, if_revision=0)
    assert scope.get("k") == 2


def test_a_conflict_in_a_transaction_undoes_only_itself(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("k", 1)
    entry = scope.entry("k")
    assert entry is not None
    with scope.transaction() as tx:
        tx.set("a", 1)
        with pytest.raises(reactor.ConflictError):
            tx.set("k", 2, if_revision=entry.revision + 1)
        tx.set("k", 3, if_revision=entry.revision)
    assert scope.list() == {"a": 1, "k": 3}


def test_threads_racing_on_if_revision_lose_no_increment(state: reactor.State) -> None:
    """Optimistic concurrency: read the entry, write if it is unchanged, else retry."""
    scope = state.scope("s")
    scope.set("n", 0)
    conflicts = []

    def add(times: int) -> None:
        done = 0
        while done < times:
            entry = scope.entry("n")
            assert entry is not None
            try:
                scope.set("n", entry.value + 1, if_revision=entry.revision)
                done += 1
            except reactor.ConflictError:
                conflicts.append(1)

    threads = [threading.Thread(target=add, args=(100,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert scope.get("n") == 400
    final = scope.entry("n")
    assert final is not None
    assert final.version == 401


PROCESS_ADDER = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        scope = state.scope("s")
        done = conflicts = 0
        while done < int(sys.argv[2]):
            entry = scope.entry("n")
            try:
                scope.set("n", entry.value + 1, if_revision=entry.revision)
                done += 1
            except reactor.ConflictError:
                conflicts += 1
    print(conflicts)
"""


def test_processes_racing_on_if_revision_lose_no_increment(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("n", 0)
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PROCESS_ADDER), str(db_path), "50"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0] * 4, [err for _, err in outputs]
    with reactor.open(db_path) as state:
        assert state.scope("s").get("n") == 200
        entry = state.scope("s").entry("n")
        assert entry is not None
        assert entry.version == 201


# -- history and at_revision ----------------------------------------------------------


def test_history_is_one_keys_events_oldest_first(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("a", 1)
    scope.set("ab", 1)  # a key that the first one is a prefix of: not in a's history
    state.scope("t").set("a", 1)  # the same key in another scope: not either
    scope.increment("a")
    scope.delete("a")
    scope.set("a", 7)
    history = scope.history("a")
    assert [(e.type, e.new_value, e.version) for e in history] == [
        ("created", 1, 1),
        ("updated", 2, 2),
        ("deleted", None, 0),
        ("created", 7, 1),
    ]
    assert all(e.scope == "s" and e.key == "a" for e in history)
    assert [e.revision for e in scope.history("a", since=history[1].revision)] == [
        history[2].revision,
        history[3].revision,
    ]
    assert scope.history("a", limit=2) == history[:2]
    assert scope.history("a", limit=0) == []
    assert scope.history("never") == []
    with pytest.raises(reactor.InvalidArgumentError):
        scope.history("a", limit=-1)


def test_history_pages_through_long_histories(state: reactor.State) -> None:
    scope = state.scope("s")
    for n in range(2500):
        scope.set("k", n)
    history = scope.history("k")
    assert [e.new_value for e in history] == list(range(2500))
    assert [e.new_value for e in scope.history("k", since=history[999].revision, limit=1200)] == (
        list(range(1000, 2200))
    )


def test_history_and_at_revision_after_compaction(open_state: Callable[..., reactor.State]) -> None:
    state = open_state(log_retention=3)
    scope = state.scope("s")
    for n in range(10):
        scope.set("k", n)
    revision = state.changes()[-1].revision
    engine = engine_of(state)
    engine.sweeper.compact()
    assert [e.new_value for e in scope.history("k")] == [7, 8, 9]
    with pytest.raises(reactor.RevisionCompactedError):
        scope.history("k", since=1)
    with pytest.raises(reactor.RevisionCompactedError):
        scope.get("k", at_revision=2)
    assert scope.get("k", at_revision=revision - 1) == 8
    assert scope.get("k", at_revision=revision) == 9


def test_at_revision_of_the_future_is_refused(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("k", 1)
    last = state.changes()[-1].revision
    assert scope.get("k", at_revision=last) == 1
    with pytest.raises(reactor.InvalidArgumentError):
        scope.get("k", at_revision=last + 1)


def test_at_revision_ignores_a_transaction_bodys_writes(state: reactor.State) -> None:
    scope = state.scope("s")
    scope.set("k", 1)
    last = state.changes()[-1].revision
    with scope.transaction() as tx:
        tx.set("k", 2)
        assert tx.get("k") == 2
        assert tx.get("k", at_revision=last) == 1


def test_at_revision_sees_a_deadline_passed_before_the_revision(
    state: reactor.State, clock: ManualClock
) -> None:
    scope = state.scope("s")
    scope.set("k", 1, ttl=5)
    clock.advance(10)
    state.scope("other").set("x", 1)  # revision 2, committed after k's deadline
    assert scope.get("k", "gone", at_revision=1) == 1
    assert scope.get("k", "gone", at_revision=2) == "gone"


# The model: each step is (key, value or None to delete), on a scope of its own.
steps = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(0, 3))),
    min_size=1,
    max_size=30,
)
_examples = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps)
def test_at_revision_matches_a_model(
    state: reactor.State, steps: list[tuple[str, int | None]]
) -> None:
    scope = state.scope(f"model-{next(_examples)}")
    start = state.scope("other").increment("n") and state.changes()[-1].revision
    model: dict[str, int] = {}
    states: dict[int, dict[str, int]] = {start: {}}
    for key, value in steps:
        if value is None:
            scope.delete(key)
            model.pop(key, None)
        else:
            scope.set(key, value)
            model[key] = value
        states[state.changes()[-1].revision] = dict(model)
    for revision in range(start, max(states) + 1):
        expected = states[max(r for r in states if r <= revision)]
        for key in "abc":
            found = scope.get(key, "-", at_revision=revision)
            assert found == expected.get(key, "-"), (revision, key)


# -- a database of version 4 ----------------------------------------------------------


# -- asyncio --------------------------------------------------------------------------


def test_the_asyncio_twins(db_path: Any) -> None:
    async def main() -> None:
        async with reactor.aio.open(db_path) as state:
            scope = state.scope("s")
            await scope.set("k", 1, if_revision=0)
            entry = await scope.entry("k")
            assert entry is not None
            assert entry.version == 1
            with pytest.raises(reactor.ConflictError):
                await scope.increment("k", if_revision=entry.revision + 5)
            await scope.update("k", [ops.increment("", 1)], if_revision=entry.revision)
            history = await scope.history("k")
            assert [e.new_value for e in history] == [1, 2]
            assert await scope.get("k", at_revision=entry.revision) == 1
            with pytest.raises(reactor.ConflictError):
                await scope.set_many({"k": 0}, if_revision=entry.revision)

    asyncio.run(main())
