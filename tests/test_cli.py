"""The command line, driven as a user would: in a subprocess.

Most tests run ``reactor --db DB ...`` on the test's database (a SQLite file, or a
PostgreSQL URL with ``--backend=postgresql``); stdout is a pipe, so output is JSON.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

import reactor
from tests.conftest import CLI_ENV, canon, run_reactor


def _ok(db: Any, *args: str, cwd: Path, stdin: str | None = None) -> Any:
    """Run ``reactor --db DB ARGS``, expect success, return its stdout as JSON."""
    done = run_reactor("--db", str(db), *args, cwd=cwd, stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def _fails(db: Any, *args: str, cwd: Path, status: int = 1) -> str:
    """Run ``reactor --db DB ARGS``, expect exit status ``status`` (1: not found or
    refused); return the one-line error."""
    done = run_reactor("--db", str(db), *args, cwd=cwd)
    assert done.returncode == status, (done.stdout, done.stderr)
    assert done.stderr.startswith("Error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def _run_all(
    db: Any, commands: list[tuple[str, ...]], cwd: Path
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``reactor --db DB`` with each of ``commands``, a few at a time (they are
    independent, and each spends most of its time starting Python)."""
    done: list[subprocess.CompletedProcess[str]] = []
    for start in range(0, len(commands), 4):
        batch = [
            (
                args,
                subprocess.Popen(
                    [sys.executable, "-m", "reactor", "--db", str(db), *args],
                    cwd=cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=CLI_ENV,
                ),
            )
            for args in commands[start : start + 4]
        ]
        for args, process in batch:
            try:
                out, err = process.communicate(timeout=60)
            finally:
                process.kill()
            done.append(subprocess.CompletedProcess(args, process.returncode, out, err))
    return done


def _ok_all(db: Any, *commands: tuple[str, ...], cwd: Path) -> list[Any]:
    """``_run_all``, expecting success: each command's stdout, as JSON."""
    results = []
    for done in _run_all(db, list(commands), cwd):
        assert done.returncode == 0, (done.args, done.stderr)
        assert done.stderr == "", done.args
        results.append(json.loads(done.stdout))
    return results


def test_version(tmp_path: Path) -> None:
    done = run_reactor("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"reactor, version {reactor.__version__}"


def test_the_console_script_is_installed() -> None:
    script = shutil.which("reactor", path=str(Path(sys.executable).parent))
    assert script is not None


def test_errors_are_one_line_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "not-a-db").write_text("this is not a database" * 100)
    done = run_reactor("demo", "--db", str(tmp_path / "not-a-db"), cwd=tmp_path)
    assert done.returncode == 3  # storage
    assert done.stderr.startswith("Error: ")
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


# -- one command at a time -------------------------------------------------------
def test_set_then_get_prints_json(db_path: Any, tmp_path: Path) -> None:
    value = {"total": 1.0, "paid": True, "n": 1, "none": None, "name": "Zoë", "tags": ["a"]}
    assert _ok(db_path, "set", "orders", "o-1", json.dumps(value), cwd=tmp_path) == {
        "old_value": None,
        "new_value": value,
    }
    assert canon(_ok(db_path, "get", "orders", "o-1", cwd=tmp_path)) == canon(value)
    changed = _ok(db_path, "set", "orders", "o-1", "-5", cwd=tmp_path)  # a negative number
    assert canon(changed) == canon({"old_value": value, "new_value": -5})
    assert _ok(db_path, "set", "orders", "o-2", "-", cwd=tmp_path, stdin='"from stdin"\n')
    with reactor.open(db_path) as state:
        assert state.scope("orders").get("o-1") == -5
        assert state.scope("orders").get("o-2") == "from stdin"


def test_get_a_missing_key(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", None)
    assert _ok(db_path, "get", "s", "k", cwd=tmp_path) is None
    assert "no key 'other' in scope 's'" in _fails(db_path, "get", "s", "other", cwd=tmp_path)
    assert _ok(db_path, "get", "s", "other", "--default", "-1", cwd=tmp_path) == -1


def test_exists_mget_expire_and_persist_as_redis_cli(db_path: Any, tmp_path: Path) -> None:
    reactor.open(db_path).close()

    def ok(*args: str) -> Any:  # one after the other: each sees the one before
        done = run_reactor("--db", str(db_path), *args, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        return json.loads(done.stdout)

    ok("set", "s", "a", "1")
    present, values = ok("exists", "s", "a", "b", "a"), ok("mget", "s", "a", "b")
    expiring, left = ok("expire", "s", "a", "100"), ok("ttl", "s", "a")
    persisted, kept = ok("persist", "s", "a"), ok("ttl", "s", "a")
    missing = ok("expire", "s", "b", "5")
    assert present == 2  # a named twice counts twice, as Redis EXISTS
    assert values == [1, None]
    assert expiring is True
    assert 0 < left <= 100
    assert persisted is True
    assert kept == -1
    assert missing is False
    with reactor.open(db_path) as state:
        assert state.scope("s").ttl("b") == -2  # expire creates nothing
    refused = run_reactor("--db", str(db_path), "expire", "s", "a", "0", cwd=tmp_path)
    assert refused.returncode == 2
    assert "x>0" in refused.stderr
    reserved = run_reactor("--db", str(db_path), "persist", "queue:jobs", "1", cwd=tmp_path)
    assert reserved.returncode != 0


def test_ttl_incr_and_delete(db_path: Any, tmp_path: Path) -> None:
    reactor.open(db_path).close()  # reads run alongside the first writes: the database exists
    set_, one, absent, nothing = _ok_all(
        db_path,
        ("set", "s", "soon", '"x"', "--ttl", "100"),
        ("incr", "s", "n"),
        ("ttl", "s", "absent"),
        ("delete", "s", "absent"),
        cwd=tmp_path,
    )
    assert set_ == {"old_value": None, "new_value": "x"}
    assert one == 1
    assert absent == -2
    assert nothing == {"deleted": False, "old_value": None}
    kept, total, no_expiry = _ok_all(
        db_path,
        ("set", "s", "soon", '"y"', "--keep-ttl"),
        ("incr", "s", "n", "-2.5"),
        ("ttl", "s", "n"),
        cwd=tmp_path,
    )
    assert kept == {"old_value": "x", "new_value": "y"}
    assert total == -1.5
    assert no_expiry == -1
    left, deleted = _ok_all(db_path, ("ttl", "s", "soon"), ("delete", "s", "n"), cwd=tmp_path)
    assert 90 < left <= 100
    assert deleted == {"deleted": True, "old_value": -1.5}


def test_update_prints_old_new_and_errors(db_path: Any, tmp_path: Path) -> None:
    ops = [{"type": "increment", "path": "n", "by": 2}, {"type": "merge", "value": {"a": 1}}]
    result = _ok(db_path, "update", "s", "doc", json.dumps(ops), cwd=tmp_path)
    assert result == {"old_value": None, "new_value": {"n": 2, "a": 1}, "errors": []}
    patch = {"op": "add", "path": "/list", "value": [1]}  # one op alone: a list of one
    result = _ok(db_path, "update", "s", "doc", json.dumps(patch), cwd=tmp_path)
    assert result["new_value"] == {"n": 2, "a": 1, "list": [1]}

    failing = [{"type": "increment", "path": "list"}, {"type": "set", "path": "b", "value": 0}]
    done = run_reactor(
        "--db", str(db_path), "update", "s", "doc", json.dumps(failing), cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr == "Error: 1 of 2 ops did not apply\n"
    result = json.loads(done.stdout)
    assert result["new_value"] == {"n": 2, "a": 1, "list": [1], "b": 0}
    assert [(e["index"], e["code"]) for e in result["errors"]] == [(0, "type_mismatch")]


def test_keys_list_scopes_and_stats(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set_many({"o-1": 1, "o-2": {"x": 2}, "customer": "c"})
        state.scope("jobs").set("j-1", [1.5])
    keys, some_keys, items, some_items, scopes, stats = _ok_all(
        db_path,
        ("keys", "orders"),
        ("keys", "orders", "o-*"),
        ("list", "orders"),
        ("list", "orders", "o-[2-9]"),
        ("scopes",),
        ("stats",),
        cwd=tmp_path,
    )
    assert keys == ["customer", "o-1", "o-2"]
    assert some_keys == ["o-1", "o-2"]
    assert items == {"customer": "c", "o-1": 1, "o-2": {"x": 2}}
    assert list(items) == ["customer", "o-1", "o-2"]
    assert some_items == {"o-2": {"x": 2}}
    assert scopes == {"jobs": 1, "orders": 3}
    assert stats["scopes"] == {"jobs": 1, "orders": 3}
    assert stats["keys"] == 4
    assert stats["revision"] >= 2


def test_the_database_can_come_from_reactor_db(db_path: Any, tmp_path: Path) -> None:
    env = {**CLI_ENV, "REACTOR_DB": str(db_path)}
    done = run_reactor("set", "s", "k", "[1]", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    done = run_reactor("get", "s", "k", cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (0, "[1]\n")
    elsewhere = tmp_path / "other.db"  # --db wins over $REACTOR_DB, before or after the command
    with reactor.open(elsewhere) as state:
        state.scope("s").set("k", 2)
    done = run_reactor("get", "s", "k", "--db", str(elsewhere), cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (0, "2\n")


# -- errors ----------------------------------------------------------------------
# What the command was given is a usage error (2); what the data refuses, 1.
ERRORS: list[tuple[tuple[str, ...], str, int]] = [
    (("set", "s", "k", "hello"), "the value is not JSON: 'hello'", 2),
    (("set", "s", "k", "NaN"), "the value is not JSON", 2),
    (("set", "s", "", "1"), "a key must not be empty", 2),
    (("set", "", "k", "1"), "a scope name must not be empty", 2),
    (("set", "s", "k", "1", "--ttl", "inf"), "ttl must be a number of seconds > 0", 2),
    (("get", "s", ""), "a key must not be empty", 2),
    (("update", "s", "k", "[1]"), "ops[0] is int, not a dict", 2),
    (("incr", "s", "k", "x"), "BY is not JSON", 2),
    (("incr", "s", "k", '"2"'), "by must be an int or a float", 1),
    (("incr", "s", "text"), "the value of 'text' is str, not a number", 1),
]


def test_errors_are_a_line_on_stderr_with_their_status(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("text", "abc")
    for done, (args, message, status) in zip(
        _run_all(db_path, [args for args, _, _ in ERRORS], tmp_path), ERRORS, strict=True
    ):
        assert done.returncode == status, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("Error: "), (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1, (args, done.stderr)
        assert done.stdout == "", args
    with reactor.open(db_path) as state:
        assert state.scope("s").list() == {"text": "abc"}  # nothing was written


READS: list[tuple[str, ...]] = [
    ("get", "s", "k"),
    ("keys", "s"),
    ("list", "s"),
    ("scopes",),
    ("ttl", "s", "k"),
    ("stats",),
    ("watch",),
    ("export",),
]


def test_reading_a_missing_database_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    for done in _run_all(missing, READS, tmp_path):
        assert done.returncode == 3, (done.args, done.stderr)  # storage
        assert done.stderr == f"Error: no database at {missing}\n", done.args
    assert not missing.parent.exists()
    _ok(missing, "set", "s", "k", "1", cwd=tmp_path)  # a write creates it
    assert missing.exists()


USAGE: list[tuple[str, ...]] = [
    ("set", "s", "k", "1", "--ttl", "0"),
    ("set", "s", "k", "1", "--ttl", "1", "--keep-ttl"),
    ("import", "no-such-file.jsonl"),
]


def test_usage_errors_exit_with_2(db_path: Any, tmp_path: Path) -> None:
    for done in _run_all(db_path, USAGE, tmp_path):
        assert done.returncode == 2, (done.args, done.stderr)
        assert "Error:" in done.stderr, done.args
        assert "Traceback" not in done.stderr, done.args


def _writes_to(scope: str) -> list[tuple[str, ...]]:
    """Every command that writes to a scope, writing to ``scope``."""
    return [
        ("set", scope, "k", "1"),
        ("update", scope, "k", '{"type": "increment", "path": "n"}'),
        ("delete", scope, "k"),
        ("incr", scope, "k"),
        ("timers", "add", scope, "k", "1", "--after", "60"),
    ]


def test_writes_to_a_scope_of_events_are_usage_errors(db_path: Any, tmp_path: Path) -> None:
    for scope in ("queue:jobs", "run:fulfil"):
        for done in _run_all(db_path, _writes_to(scope), tmp_path):
            assert done.returncode == 2, (done.args, done.stderr)
            assert done.stderr.splitlines()[-1] == (
                f"Error: Invalid value for 'SCOPE': cannot write to scope {scope!r}: scope names"
                " beginning with 'queue:' or 'run:' are reserved for the events of queues and"
                " workflow runs"
            ), done.args
            assert "Traceback" not in done.stderr, done.args
            assert done.stdout == "", done.args
    if isinstance(db_path, Path):
        assert not db_path.exists()  # refused before any database is opened or created


def test_a_queues_events_read_through_its_scope(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.queue("jobs").put({"to": "ada"})
    watch = ("watch", "--scope", "queue:*", "--since", "0", "--limit", "1")
    done = run_reactor("--db", str(db_path), *watch, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    event = json.loads(done.stdout)
    assert (event["scope"], event["key"], event["type"]) == ("queue:jobs", "1", "created")
    assert event["new_value"]["item"] == {"to": "ada"}
    assert _ok(db_path, "keys", "queue:jobs", cwd=tmp_path) == []  # a job is no key


# -- what users of redis-cli, etcdctl and sqlite-utils expect ---------------------
def test_raw_prints_strings_as_text(db_path: Any, tmp_path: Path) -> None:
    text = 'Zoë says "hi"\tand\nbye \\o/ \x1b[31m'
    with reactor.open(db_path) as state:
        state.scope("s").set_many({"text": text, "n": 1.5, "doc": {"a": [1, "x"]}, "no": None})
        state.scope("s").set("soon", "x", ttl=100)
    runs = _run_all(
        db_path,
        [
            ("get", "s", "text", "--raw"),
            ("--raw", "get", "s", "text"),  # before the command, as redis-cli --raw
            ("--raw", "get", "s", "n"),
            ("get", "s", "doc", "--raw"),
            ("--table", "get", "s", "no", "--raw"),  # --raw wins
            ("get", "s", "absent", "--default", '"fallback"', "--raw"),
            ("keys", "s", "--raw"),
            ("incr", "counts", "n", "--raw"),
            ("ttl", "s", "text", "--raw"),
            ("--raw", "list", "s", "t*"),  # --raw given to the group: ignored by list
            ("get", "s", "text"),
        ],
        tmp_path,
    )
    for done in runs:
        assert (done.returncode, done.stderr) == (0, ""), (done.args, done.stderr)
    outputs = [done.stdout for done in runs]
    assert outputs == [
        text + "\n",
        text + "\n",
        "1.5\n",
        '{"a":[1,"x"]}\n',
        "null\n",
        "fallback\n",
        "doc\nn\nno\nsoon\ntext\n",
        "1\n",
        "-1\n",
        json.dumps({"text": text}, ensure_ascii=False, separators=(",", ":")) + "\n",
        json.dumps(text, ensure_ascii=False) + "\n",
    ]


def test_limit_on_keys_list_and_watch(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set_many({f"k{n}": n for n in range(5)} | {"other": 0})
    keys, some, items, more_than_all = _ok_all(
        db_path,
        ("keys", "s", "--limit", "2"),
        ("keys", "s", "k*", "--limit", "3"),
        ("list", "s", "k*", "--limit", "2"),
        ("list", "s", "--limit", "100"),
        cwd=tmp_path,
    )
    assert keys == ["k0", "k1"]
    assert some == ["k0", "k1", "k2"]
    assert items == {"k0": 0, "k1": 1}
    assert len(more_than_all) == 6
    done = run_reactor("--db", str(db_path), "watch", "--since", "0", "--limit", "2", cwd=tmp_path)
    assert [json.loads(line)["key"] for line in done.stdout.splitlines()] == ["k0", "k1"]
    for done in _run_all(
        db_path, [("keys", "s", "--limit", "0"), ("list", "s", "--limit", "-1")], tmp_path
    ):
        assert done.returncode == 2, (done.args, done.stderr)
        assert "Invalid value for '--limit'" in done.stderr, done.stderr


MISTAKES: list[tuple[tuple[str, ...], str]] = [
    (("lsit", "s"), "No such command 'lsit'. Did you mean 'list'?"),
    (("delte", "s", "k"), "Did you mean 'delete'?"),
    (("put", "s", "k", "1"), "No such command 'put'. Did you mean 'set'?"),  # etcdctl
    (("del", "s", "k"), "Did you mean 'delete'?"),  # redis-cli
    (("GET", "s", "k"), "Did you mean 'get'?"),
    (("frobnicate",), "No such command 'frobnicate'.\n"),
    (("keys", "s", "--limt", "3"), "No such option '--limt'. Did you mean '--limit'?"),
    (("--jsn", "scopes"), "Did you mean '--json'?"),
    # get, set and incr take unknown options as arguments (a value of -1): still caught.
    (("get", "s", "k", "--rwa"), "No such option '--rwa'. Did you mean '--raw'?"),
    (("set", "s", "k", "1", "--tll", "5"), "'--ttl'?"),  # and '--table'
    (("set", "s", "k", "1", "--raw"), "No such option '--raw'."),
]


def test_a_misspelled_command_or_option_gets_a_suggestion(db_path: Any, tmp_path: Path) -> None:
    reactor.open(db_path).close()
    for done, (args, message) in zip(
        _run_all(db_path, [args for args, _ in MISTAKES], tmp_path), MISTAKES, strict=True
    ):
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
    with reactor.open(db_path) as state:
        assert state.scopes() == []  # nothing ran


def test_shell_completion(tmp_path: Path) -> None:
    script = shutil.which("reactor", path=str(Path(sys.executable).parent))
    assert script is not None
    env = {**CLI_ENV, "_REACTOR_COMPLETE": "bash_source"}
    source = subprocess.run(
        [script], capture_output=True, text=True, env=env, timeout=60, check=True, cwd=tmp_path
    ).stdout
    assert "_reactor_completion() {" in source
    assert "complete -o nosort -F _reactor_completion reactor" in source
    env = {**CLI_ENV, "_REACTOR_COMPLETE": "bash_complete", "COMP_CWORD": "1"}
    for words, expected in [("reactor ke", "plain,keys"), ("reactor keys s --li", "plain,--limit")]:
        env["COMP_WORDS"], env["COMP_CWORD"] = words, str(len(words.split()) - 1)
        done = subprocess.run(
            [script], capture_output=True, text=True, env=env, timeout=60, check=True, cwd=tmp_path
        )
        assert done.stdout.split() == [expected], words
    bash = shutil.which("bash")
    if bash is not None:  # what the docs tell users to put in ~/.bashrc works
        line = f'eval "$(_REACTOR_COMPLETE=bash_source {script})"; complete -p reactor'
        done = subprocess.run(
            [bash, "-c", line], capture_output=True, text=True, env=CLI_ENV, timeout=60, check=False
        )
        assert done.stdout.strip() == "complete -o nosort -F _reactor_completion reactor", done


# -- export and import -----------------------------------------------------------
VALUES: dict[str, dict[str, Any]] = {
    "orders": {"o-1": {"total": 120, "lines": [{"sku": "a", "qty": 1.0}]}, "o-2": None},
    "odd scope/name:*": {"k*?[x]": "Zoë ✓", "1": 1, "1.0": 1.0},
    "flags": {"t": True, "f": False, "zero": 0, "empty": "", "list": [], "obj": {}},
}


def _fill(db: Any) -> None:
    with reactor.open(db) as state:
        for scope, values in VALUES.items():
            state.scope(scope).set_many(values)
        state.scope("cache").set("rate", 1.08, ttl=300)
        state.scope("cache").set("quote", {"eur": 1.1}, ttl=30.5)
        state.scope("cache").set("forever", "x")


def _everything(db: Any) -> dict[str, Any]:
    with reactor.open(db) as state:
        return {
            scope: {
                key: (value, state.scope(scope).ttl(key))
                for key, value in state.scope(scope).list().items()
            }
            for scope in state.scopes()
        }


def test_export_then_import_round_trips(db_path: Any, fresh_db: Any, tmp_path: Path) -> None:
    _fill(db_path)
    started = time.monotonic()
    before = _everything(db_path)
    backup = tmp_path / "backup.jsonl"
    assert _ok(db_path, "export", str(backup), cwd=tmp_path) == {
        "exported": 14,
        "keys": 14,
        "timers": 0,
        "queues": 0,
        "jobs": 0,
        "file": str(backup),
    }
    exporting = time.monotonic() - started
    lines = [json.loads(line) for line in backup.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 14
    assert all(set(line) == {"scope", "key", "value", "ttl"} for line in lines)
    assert [(line["scope"], line["key"]) for line in lines] == sorted(
        (line["scope"], line["key"]) for line in lines
    )
    exported = {(line["scope"], line["key"]): line["ttl"] for line in lines}

    started = time.monotonic()
    assert _ok(fresh_db, "import", str(backup), cwd=tmp_path)["imported"] == 14
    after = _everything(fresh_db)
    importing = time.monotonic() - started
    assert canon({s: {k: v for k, (v, _) in keys.items()} for s, keys in after.items()}) == canon(
        {s: {k: v for k, (v, _) in keys.items()} for s, keys in before.items()}
    )
    # A TTL loses the time that passes, and nothing else: the seconds left at export
    # time go in the file, and count from the import.
    for scope, keys in before.items():
        for key, (_, ttl) in keys.items():
            left = exported[scope, key]
            if ttl == -1:
                assert left is None
                assert after[scope][key][1] == -1
            else:
                assert -0.01 <= ttl - left <= exporting + 0.01, (scope, key)
                assert -0.01 <= left - after[scope][key][1] <= importing + 0.01, (scope, key)
    assert sum(left is not None for left in exported.values()) == 2


def test_export_to_stdout_and_import_from_stdin(
    db_path: Any, fresh_db: Any, tmp_path: Path
) -> None:
    _fill(db_path)
    done = run_reactor("--db", str(db_path), "export", "--scope", "o*", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {line["scope"] for line in lines} == {"orders", "odd scope/name:*"}
    assert _ok(fresh_db, "import", cwd=tmp_path, stdin=done.stdout) == {
        "imported": 5,
        "keys": 5,
        "timers": 0,
        "queues": 0,
        "jobs": 0,
        "skipped": 0,
    }
    assert canon(_ok(fresh_db, "list", "odd scope/name:*", cwd=tmp_path)) == canon(
        VALUES["odd scope/name:*"]
    )


def test_export_then_import_carries_timers_and_queues(
    db_path: Any, fresh_db: Any, tmp_path: Path
) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
        timer = state.scope("orders").schedule("reminder", True, after=3600, every=600)
        emails = state.queue("emails", max_attempts=2)
        emails.put("a", key="ka")
        emails.put("b", delay=3600)
        assert emails.take(timeout=0) is not None  # "a", exported as ready again
        failed = state.queue("failed", max_attempts=1)
        failed.put("x")
        taken = failed.take(timeout=0)
        assert taken is not None
        taken.nack()  # dead
    backup = tmp_path / "backup.jsonl"
    counts = {"keys": 1, "timers": 1, "queues": 2, "jobs": 3}
    assert _ok(db_path, "export", str(backup), cwd=tmp_path) == {
        "exported": 5,
        **counts,
        "file": str(backup),
    }
    assert _ok(fresh_db, "import", str(backup), cwd=tmp_path) == {
        "imported": 5,
        **counts,
        "skipped": 0,
    }
    with reactor.open(fresh_db) as state:
        (restored,) = state.timers()
        assert restored._replace(due=0) == timer._replace(due=0)
        assert 3500 < restored.due - time.time() <= 3600  # the time it had left
        assert state.queue("emails").stats() == {
            "ready": 1,
            "delayed": 1,
            "taken": 0,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
        job = state.queue("emails").take(timeout=0)
        assert job is not None
        assert (job.item, job.attempts) == ("a", 2)  # its take at export time counted
        assert [(job.item, job.attempts) for job in state.queue("failed").dead()] == [("x", 1)]

    # Again: the timer is replaced, "a" (still taken, holding its key) is skipped.
    done = run_reactor("--db", str(fresh_db), "--table", "import", str(backup), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert " ".join(done.stdout.split()) == (  # the line as a terminal shows it
        "1 key, 1 timer, 2 queues and 2 jobs imported "
        "(1 job skipped: already queued under its idempotency key)"
    )
    with reactor.open(fresh_db) as state:
        assert [t.id for t in state.timers()] == [timer.id]
        assert state.queue("emails").stats() == {
            "ready": 0,
            "delayed": 2,
            "taken": 1,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }

    assert _ok(db_path, "export", "--only", "keys", "keys.jsonl", cwd=tmp_path)["exported"] == 1
    assert (tmp_path / "keys.jsonl").read_text(encoding="utf-8").count("\n") == 1
    done = run_reactor(
        "--db", str(db_path), "export", "--only", "queues", "--scope", "o*", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "queues belong to no scope" in done.stderr


def test_import_checks_every_line_first(db_path: Any, tmp_path: Path) -> None:
    good = {"scope": "s", "key": "k", "value": 1, "ttl": None}
    bad = [
        good,
        "not json",
        {"scope": "s", "key": "", "value": 1},
        {"scope": "s", "key": "k2", "value": 1, "ttl": 0},
        {"scope": "s", "key": "k3"},
        good,
        [1],
        {"scope": "queue:q", "key": "1", "value": {"state": "ready"}},  # a queue's events
    ]
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in bad)
    (tmp_path / "bad.jsonl").write_text(text + "\n\n", encoding="utf-8")
    error = _fails(db_path, "import", str(tmp_path / "bad.jsonl"), cwd=tmp_path, status=2)
    assert error.startswith("Error: 6 bad lines, nothing imported: line 2: not JSON")
    for number in (3, 4, 5, 7, 8):
        assert f"line {number}: " in error
    assert "line 1:" not in error
    assert "line 6:" not in error
    assert "a key must not be empty" in error
    assert "'ttl' must be a number of seconds > 0 or null, not 0" in error
    assert "missing 'value'" in error
    assert "line 8: cannot write to scope 'queue:q': scope names beginning with" in error
    with reactor.open(db_path) as state:
        assert state.scopes() == []


# -- watch -----------------------------------------------------------------------
def _watcher(db: Any, *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reactor", "--db", str(db), "watch", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CLI_ENV,
    )


def _wait_for_line(stream: IO[str], text: str, timeout: float = 30.0) -> str:
    """Read lines from ``stream`` until one holds ``text``; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            line = stream.readline()
            if text in line:
                return line
            if not line:
                break
    pytest.fail(f"no line with {text!r} within {timeout} s")


def test_watch_streams_other_processes_writes(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
    watcher = _watcher(db_path, "--scope", "orders", "--key", "o-*", "--count", "3", cwd=tmp_path)
    try:
        assert watcher.stderr is not None
        _wait_for_line(watcher.stderr, "watching")
        _ok(db_path, "set", "orders", "o-1", '{"total": 1}', cwd=tmp_path)  # another process
        with reactor.open(db_path) as state:  # and this one, a third
            state.scope("jobs").set("o-1", 0)  # filtered out: scope
            state.scope("orders").set("x", 0)  # filtered out: key
            state.scope("orders").update("o-1", [reactor.ops.increment("total")])
            state.scope("orders").delete("o-1")
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        watcher.communicate()  # reaped, pipes closed, whatever happened
    assert watcher.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e["old_value"], e["new_value"]) for e in events] == [
        ("updated", 1, {"total": 1}),
        ("updated", {"total": 1}, {"total": 2}),
        ("deleted", {"total": 2}, None),
    ]
    assert events[1]["ops"] == [{"type": "increment", "path": "total", "by": 1}]
    assert [e["revision"] for e in events] == sorted(e["revision"] for e in events)
    assert all(e["scope"] == "orders" and e["key"] == "o-1" for e in events)


def test_watch_since_replays_the_log(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").increment("n")
        state.scope("s").increment("n")
        state.scope("s").increment("n")
    done = run_reactor("--db", str(db_path), "watch", "--since", "0", "--count", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["type"], e["new_value"]) for e in events] == [
        ("created", 1),
        ("updated", 2),
        ("updated", 3),
    ]


def test_watch_takes_several_globs(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
        state.scope("other").set("o-1", 2)
        state.scope("orders|ledger").set("o-1", 3)  # a glob has no alternation
        state.scope("ledger").set("l-1", 4)
    several = ("--scope", "orders", "--scope", "ledg*", "--key", "o-*", "--key", "l-1")
    watch = ("watch", *several, "--since", "0", "--limit", "2")
    done = run_reactor("--db", str(db_path), *watch, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["scope"], e["new_value"]) for e in events] == [("orders", 1), ("ledger", 4)]
    watch = ("watch", "--scope", "orders|ledger", "--since", "0", "--limit", "1")
    done = run_reactor("--db", str(db_path), *watch, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["new_value"] == 3


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_watch_cleanly(db_path: Any, tmp_path: Path, sent: signal.Signals) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    watcher = _watcher(db_path, cwd=tmp_path)
    try:
        assert watcher.stderr is not None
        _wait_for_line(watcher.stderr, "watching")
        watcher.send_signal(sent)
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        watcher.communicate()  # reaped, pipes closed, whatever happened
    assert watcher.returncode in (0, 130), err
    assert "Traceback" not in err
    assert out == ""


# -- on a terminal ---------------------------------------------------------------
def test_tables_on_a_terminal(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set_many({"o-1": {"total": 120}, "o-2": "two"})
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "reactor", "--db", str(db_path), "list", "orders"],
            cwd=tmp_path,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env={**CLI_ENV, "TERM": "dumb", "NO_COLOR": "1"},
        )
        os.close(follower)
        follower = -1
        shown = b""
        while select.select([leader], [], [], 1.0)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert done.returncode == 0, done.stderr
    text = shown.decode()
    assert "┃ key" in text
    rows = [line for line in text.splitlines() if "o-" in line]
    assert rows[0].split()[1:3] == ["o-1", "│"]
    assert '{"total":120}' in rows[0]
    assert rows[1].split()[1:4] == ["o-2", "│", '"two"']


def test_table_and_json_can_be_asked_for(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", [1, 2])
    scopes, ttl, value = _run_all(
        db_path,
        [
            ("--table", "scopes"),
            ("--table", "ttl", "s", "k"),
            ("--table", "get", "s", "k", "--json"),
        ],
        tmp_path,
    )
    assert scopes.returncode == 0, scopes.stderr
    assert scopes.stdout.splitlines()[1].split() == ["┃", "scope", "┃", "keys", "┃"]
    assert scopes.stdout.splitlines()[3].split() == ["│", "s", "│", "1", "│"]
    assert ttl.stdout == "(no expiry)\n"
    assert value.stdout == "[1,2]\n"  # the command's option wins over the group's


def test_every_command_is_found_where_the_group_says() -> None:
    """``reactor.cli.COMMANDS`` (which module defines each command, imported when the
    command runs) agrees with the modules' own ``COMMANDS``."""
    import importlib

    from reactor.cli import COMMANDS

    defined = {
        command.name: module
        for module in set(COMMANDS.values())
        for command in importlib.import_module(f"reactor.cli.{module}").COMMANDS
    }
    assert defined == COMMANDS
