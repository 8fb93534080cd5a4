"""A write the database refuses fails alone (issue 22, item 1).

Writes of several threads, and of several requests of one scope, share transactions
(``_combine`` on PostgreSQL, an actor's batch on both backends). When the database
refuses one of them at the flush (a trigger, a constraint, a limit), nothing of that
transaction was applied: each write sharing it is tried again on its own, so that only
the refused one fails, with a ``StorageError``, and no event goes out for it.

The refusal is a trigger the test adds on the rows table, refusing the key "poison"
(a PL/pgSQL ``RAISE``, SQLSTATE P0001, on PostgreSQL; ``RAISE(ABORT)`` on SQLite).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import reactor
from reactor import StorageError
from tests.conftest import engine_of

from .conftest import held_elsewhere, raw_query, wait_for

POISON = "poison"
WRITERS = 4
ROUNDS = 60


def refuse_poison(db: Any) -> None:
    """Make the database refuse every write of the key ``poison``."""
    if isinstance(db, str) and db.startswith("postgresql"):
        raw_query(
            db,
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.key = 'poison' THEN RAISE EXCEPTION 'refused by the test'; "
            "END IF; RETURN NEW; END $$",
        )
        raw_query(
            db,
            "CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON reactor_kv "
            "FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        )
        return
    for event in ("INSERT", "UPDATE"):
        raw_query(
            db,
            f"CREATE TRIGGER refuse_poison_{event.lower()} BEFORE {event} ON reactor_kv "
            "FOR EACH ROW WHEN NEW.key = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )


def test_a_refused_write_fails_alone_among_other_threads_writes(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("warm").set("k", 1)  # the schema exists
        refuse_poison(db_path)
        events: list[reactor.ChangeEvent] = []
        state.subscribe(events.append)
        failures: dict[str, list[BaseException]] = {}
        start = threading.Barrier(WRITERS + 1)

        def writer(name: str) -> None:
            scope = state.scope(name)
            start.wait(10)
            for n in range(ROUNDS):
                key = POISON if name == "bad" else f"k{n}"
                try:
                    scope.set(key, n)
                except Exception as exc:
                    failures.setdefault(name, []).append(exc)

        threads = [
            threading.Thread(target=writer, args=(name,))
            for name in ["bad", *(f"good{i}" for i in range(WRITERS))]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert set(failures) == {"bad"}, {k: v[:1] for k, v in failures.items() if k != "bad"}
        assert len(failures["bad"]) == ROUNDS
        assert all(isinstance(exc, StorageError) for exc in failures["bad"])
        assert "refused" in str(failures["bad"][0])
        for i in range(WRITERS):
            assert state.scope(f"good{i}").list() == {f"k{n}": n for n in range(ROUNDS)}
        assert state.scope("bad").list() == {}
        state.close()
    assert not [event for event in events if event.key == POISON]


def test_a_refused_request_fails_alone_in_its_actors_batch(db_path: Path) -> None:
    """Requests of one scope queued while a batch runs commit in one transaction."""
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        scope.set("warm", 1)
        refuse_poison(db_path)
        mailbox = engine_of(state)._mailbox("s")
        outcomes: dict[str, Any] = {}

        def writer(key: str) -> None:
            try:
                outcomes[key] = scope.set(key, key)
            except Exception as exc:
                outcomes[key] = exc

        keys = [POISON, *(f"k{n}" for n in range(7))]
        threads = [threading.Thread(target=writer, args=(key,)) for key in keys]
        with held_elsewhere(mailbox._running):  # as if a batch were running
            for thread in threads:
                thread.start()
            wait_for(lambda: len(mailbox._pending) == len(keys))
        for thread in threads:
            thread.join(30)
        assert isinstance(outcomes[POISON], StorageError), outcomes[POISON]
        for key in keys[1:]:
            assert outcomes[key] == reactor.Change(None, key), outcomes[key]
        assert scope.get(POISON) is None
        assert scope.keys("k*") == keys[1:]
