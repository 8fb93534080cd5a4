"""The command line's verbs on what the database records besides values (history,
clear, locks, subscribers; reactor/cli/records.py), and what every command shares:
exit statuses, completion of scopes and keys, readable durations, short timer ids and
--string. Driven in subprocesses, as a user would, on the test's backend."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

import reactor
from tests.conftest import CLI_ENV, run_reactor


def _cli(db: Any, cwd: Path) -> Any:
    """``ok(*args)``: run ``reactor --db DB ARGS`` (JSON out), expect status 0."""

    def ok(*args: str, stdin: str | None = None) -> Any:
        done = run_reactor("--db", str(db), "--json", *args, cwd=cwd, stdin=stdin)
        assert done.returncode == 0, (args, done.stderr)
        return json.loads(done.stdout)

    return ok


def _status(db: Any, cwd: Path, *args: str) -> tuple[int, str]:
    done = run_reactor("--db", str(db), *args, cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stderr


def test_history_prints_a_keys_changes_oldest_first(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    with reactor.open(db_path) as state:
        scope = state.scope("orders")
        scope.set("o-1", {"total": 1})
        scope.update("o-1", [{"type": "increment", "path": "total", "by": 2}])
        scope.set("other", 1)
        scope.delete("o-1")
    changes = ok("history", "orders", "o-1")
    assert [change["type"] for change in changes] == ["created", "updated", "deleted"]
    assert changes[1]["new_value"] == {"total": 3}
    assert changes[1]["ops"] == [{"type": "increment", "path": "total", "by": 2}]
    assert ok("history", "orders", "o-1", "--limit", "1") == changes[-1:]
    since = ok("history", "orders", "o-1", "--since", str(changes[0]["revision"]))
    assert since == changes[1:]
    assert ok("history", "orders", "none") == []
    table = run_reactor("--db", str(db_path), "history", "orders", "o-1", "--table", cwd=tmp_path)
    assert "updated  orders o-1" in table.stdout
    assert '{"total":1} -> {"total":3}' in table.stdout


def test_clear_deletes_the_keys_a_pattern_matches(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    with reactor.open(db_path) as state:
        state.scope("cache").set_many({"tmp:1": 1, "tmp:2": 2, "keep": 3})
    assert ok("clear", "cache", "tmp:*") == 2
    assert ok("clear", "cache", "tmp:*") == 0
    with reactor.open(db_path) as state:
        assert state.scope("cache").keys() == ["keep"]
    status, error = _status(db_path, tmp_path, "clear", "cache")
    assert status == 2  # the pattern is required: '*' must be typed
    assert "Missing argument 'PATTERN'" in error
    assert _status(db_path, tmp_path, "clear", "queue:jobs", "*")[0] == 2
    assert ok("clear", "cache", "*") == 1


def test_locks_lists_the_held_ones(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    with reactor.open(db_path) as state:
        assert ok("locks") == []
        deploy, other = state.lock("deploy:web", ttl=600), state.lock("backup", ttl=600)
        assert deploy.acquire(blocking=False)
        assert other.acquire(blocking=False)
        (held,), token = ok("locks", "deploy:*"), deploy.token
        table = run_reactor("--db", str(db_path), "locks", "--table", cwd=tmp_path).stdout
        other.release()
        listed = ok("locks")
        deploy.release()
    assert held["name"] == "deploy:web"
    assert held["token"] == token
    assert len(held["holder"]) == 32
    assert 590 < held["expires_in"] <= 600
    assert [lock["name"] for lock in listed] == ["deploy:web"]
    assert "deploy:web" in table
    assert " min " in table  # "9 min 59 s", not 599.3
    assert ok("locks") == []


def test_subscribers_shows_positions_lag_and_failures(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    reactor.open(db_path).close()
    assert ok("subscribers") == []
    done = threading.Event()

    def on_change(event: reactor.ChangeEvent) -> None:
        if event.key == "bad":
            raise RuntimeError("no such account")
        if event.key == "end":
            done.set()

    with reactor.open(db_path) as state:
        subscription = state.subscribe(on_change, durable="billing", max_retries=0)
        state.scope("s").set("bad", 1)
        state.scope("s").set("end", 1)
        assert done.wait(20)
        subscription.close()
        state.scope("s").set("later", 1)  # the subscriber is one event behind
        revision = state.scope("s").entry("later").revision
    (billing,) = ok("subscribers")
    assert billing["name"] == "billing"
    assert billing["failed"] == 1
    assert billing["lag"] == 1
    assert billing["position"] == revision - 1
    assert billing["last_failure"]["revision"] == revision - 2
    assert "RuntimeError: no such account" in billing["last_failure"]["error"]
    table = run_reactor("--db", str(db_path), "subscribers", "--table", cwd=tmp_path).stdout
    assert "no such account" in table


def test_exit_statuses(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    ok("set", "s", "n", '"text"')
    expected = {
        ("get", "s", "absent"): 1,  # not found
        ("timers", "cancel", "0123456789abcdef"): 1,
        ("queue", "job", "q", "7"): 1,
        ("incr", "s", "n"): 1,  # refused by the data: not a number
        ("set", "s", "k", "{nope"): 2,  # usage: arguments
        ("set", "s", "k", "1", "--ttl", "0"): 2,
        ("timers", "add", "s", "k", "1", "--every", "0"): 2,
        ("timers", "add", "s", "k", "1"): 2,  # no time given: the library's ValueError
        ("set", "s", "", "1"): 2,  # a key no key may be
        ("nosuch",): 2,
    }
    for args, status in expected.items():
        assert _status(db_path, tmp_path, *args)[0] == status, args
    missing = tmp_path / "nowhere" / "x.db"
    status, error = _status(missing, tmp_path, "get", "s", "k")
    assert (status, error) == (3, f"Error: no database at {missing}\n")
    (tmp_path / "junk.db").write_bytes(b"not a database, " * 512)
    assert _status(tmp_path / "junk.db", tmp_path, "get", "s", "k")[0] == 3


def test_timers_show_short_ids_and_cancel_takes_a_prefix(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    with reactor.open(db_path) as state:
        first = state.scope("s").schedule("k", 1, after=3597)
        second = state.scope("s").schedule("k", 2, after=7200, every=90)
    table = run_reactor("--db", str(db_path), "timers", "--table", cwd=tmp_path).stdout
    assert first.id not in table  # shortened, as git shortens commit ids
    assert "59 min 5" in table  # 3,597 s from the schedule
    assert "1 min 30 s" in table  # every 90 s
    same = next(i for i, (a, b) in enumerate(zip(first.id, second.id, strict=True)) if a != b)
    shared = first.id[:same]
    assert first.id[: max(8, len(shared) + 1)] in table
    status, error = _status(db_path, tmp_path, "timers", "cancel", shared)
    assert status == 2
    assert first.id in error
    assert second.id in error
    assert ok("timers", "cancel", first.id[: len(shared) + 1]) == {"cancelled": first.id}
    assert [timer["id"] for timer in ok("timers")] == [second.id]
    assert _status(db_path, tmp_path, "timers", "cancel", second.id[:3])[0] == 1  # too short
    assert _status(db_path, tmp_path, "timers", "cancel", "")[0] == 1  # names no timer
    assert [timer["id"] for timer in ok("timers")] == [second.id]


def test_string_takes_a_value_as_plain_text(db_path: Any, tmp_path: Path) -> None:
    ok = _cli(db_path, tmp_path)
    assert ok("set", "s", "motd", "-s", "back at 5")["new_value"] == "back at 5"
    assert ok("set", "s", "n", "--string", "42")["new_value"] == "42"
    assert ok("set", "s", "in", "-s", "-", stdin="from stdin\n")["new_value"] == "from stdin"
    assert ok("get", "s", "absent", "-s", "--default", "none") == "none"
    assert ok("queue", "put", "q", "-s", "mail ana")["id"] == 1
    timer = ok("timers", "add", "s", "later", "-s", "done", "--after", "60")
    with reactor.open(db_path) as state:
        assert state.queue("q").take(lease=30).item == "mail ana"
        assert state.timers()[0].id == timer["id"]
    assert _status(db_path, tmp_path, "timers", "add", "s", "k", "-s", "[]", "--ops")[0] == 2
    status, error = _status(db_path, tmp_path, "set", "s", "k", "paid")
    assert status == 2
    assert "--string" in error


def test_ttl_and_leases_print_readable_durations(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1, ttl=7300)
        state.queue("q").put("job")
        job = state.queue("q").take(lease=3600)
        assert job is not None
    table = run_reactor("--db", str(db_path), "ttl", "s", "k", "--table", cwd=tmp_path)
    assert table.stdout.startswith("2 h 1 min")  # 2 h 1 min 40 s, to its two largest units
    shown = run_reactor(
        "--db", str(db_path), "queue", "job", "q", str(job.id), "--table", cwd=tmp_path
    )
    # The lease ends in an hour: 59 min 5x s, or "1 h" when the command came within half
    # a second of the take (a duration shows its two largest units, rounded).
    assert re.search(r"\(in (59 min 5\d s|1 h)\)", shown.stdout), shown.stdout


def _complete(db: Any, cwd: Path, words: str, *, env_db: bool = False) -> list[str]:
    """What bash completion offers for the last of ``words``, through click's protocol."""
    line = f"reactor {words}" if env_db else f"reactor --db {db} {words}"
    env = {**CLI_ENV, "_REACTOR_COMPLETE": "bash_complete", "COMP_WORDS": line}
    env["COMP_CWORD"] = str(len(line.split()) - (0 if line.endswith(" ") else 1))
    if env_db:
        env["REACTOR_DB"] = str(db)
    done = run_reactor(cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return [item.partition(",")[2] for item in done.stdout.splitlines() if item]


def test_completion_of_scopes_and_keys(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set_many({"o-1": 1, "o-2": 2, "x*y": 3})
        state.scope("ops").set("k", 1)
    assert _complete(db_path, tmp_path, "get o") == ["ops", "orders"]
    assert _complete(db_path, tmp_path, "get or") == ["orders"]
    assert _complete(db_path, tmp_path, "get orders o-", env_db=True) == ["o-1", "o-2"]
    assert _complete(db_path, tmp_path, "set orders ") == ["o-1", "o-2", "x*y"]
    assert _complete(db_path, tmp_path, "delete orders x*") == ["x*y"]
    assert _complete(db_path, tmp_path, "history orders o-2") == ["o-2"]
    assert _complete(db_path, tmp_path, "watch --scope op") == ["ops"]
    missing = tmp_path / "nowhere.db"
    assert _complete(missing, tmp_path, "get o") == []
    assert not missing.exists()  # completion creates nothing


@pytest.mark.parametrize("words", ["get ", "keys ", "mget s "])
def test_completion_never_fails_loudly(tmp_path: Path, words: str) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database, " * 512)
    assert _complete(junk, tmp_path, words) == []
