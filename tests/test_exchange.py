"""Export and import through the commands (``reactor export``, ``reactor import``):
where an export may write, an import that applies all of it or nothing, and progress
on a terminal. The command line is driven in a subprocess, as in ``test_cli``.

The tests that call the backup's own functions (``reactor._backup``) on the test's
database, faults injected, are in ``test_internals.py``; the helpers here serve both.
"""

from __future__ import annotations

import io
import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

import reactor
from reactor import ops
from reactor.cli.progress import SHOW_FROM, Bar
from tests.conftest import CLI_ENV, engine_of, raw_query, run_reactor


def _fill(state: reactor.State, *, ttl: float | None = 300) -> None:
    """Five keys; one with ``ttl`` (None: a subprocess's export is compared whole,
    and time passes on its clock)."""
    state.scope("orders").set_many({"o-1": {"total": 120}, "o-2": None, "o-3": [1, 2.0]})
    state.scope("cache").set("rate", 1.08, ttl=ttl)
    state.scope("flags").set("on", True)


def _keys_only(count: int) -> dict[str, int]:
    """What the command line counts of an export or import of ``count`` keys alone."""
    return {"keys": count, "timers": 0, "queues": 0, "jobs": 0}


def _lines(count: int, scopes: int = 3, ttl_every: int = 4) -> list[str]:
    return [
        json.dumps(
            {
                "scope": f"s{n % scopes}",
                "key": f"k{n}",
                "value": {"n": n},
                "ttl": 60.0 if n % ttl_every == 0 else None,
            }
        )
        for n in range(count)
    ]


# -- export: where it writes -------------------------------------------------------
# -- export: the command line ------------------------------------------------------
def test_the_export_command_refuses_a_directory(db_path: Any, out_dir: Path) -> None:
    with reactor.open(db_path) as state:
        _fill(state)
    (out_dir / "dir").mkdir()
    done = run_reactor("--db", str(db_path), "export", "dir", cwd=out_dir)
    assert done.returncode == 2, done.stderr
    assert "is a directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert os.listdir(out_dir / "dir") == []


def test_an_export_where_no_file_can_be_made_names_the_users_file(
    db_path: Any, out_dir: Path
) -> None:
    with reactor.open(db_path) as state:
        _fill(state)
    done = run_reactor("--db", str(db_path), "export", "missing/backup.jsonl", cwd=out_dir)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        "Error: [Errno 2] cannot export to 'missing/backup.jsonl': cannot create a file "
        "in 'missing' (No such file or directory)"
    )
    assert ".tmp" not in done.stderr
    assert os.listdir(out_dir) == []


# -- export: one snapshot ----------------------------------------------------------
TOTAL = 1000  # what the transfers move between two scopes, and never change


def _transfer(state: reactor.State) -> None:
    """One transfer: both scopes and a job of the queue "moves", in one transaction."""
    with state.transaction("a", "z") as tx:
        moves = tx["a"].increment("moves")
        tx["z"].increment("moves")
        tx["a"].decrement("balance")
        tx["z"].increment("balance")
        tx.enqueue("moves", moves)


def _check_whole(text: str) -> int:
    """That an export holds every transfer whole or not at all; how many it holds."""
    lines = [json.loads(line) for line in text.splitlines()]
    values = {(x["scope"], x["key"]): x["value"] for x in lines if "ttl" in x}
    jobs = [x["item"] for x in lines if "item" in x]
    moves = values[("a", "moves")]
    assert values[("z", "moves")] == moves
    assert values[("a", "balance")] + values[("z", "balance")] == TOTAL
    assert values[("z", "balance")] == moves
    assert jobs == list(range(1, moves + 1))
    return int(moves)


# -- import: all or nothing --------------------------------------------------------
def _count_keys(db: Any) -> int:
    with reactor.open(db) as state:
        return int(state.stats()["keys"])


def _read_terminal(leader: int, process: subprocess.Popen[Any], until: bytes | None) -> bytes:
    """What the process draws on the terminal ``leader``: until ``until`` shows (then
    return at once), or until the process ends and the terminal is drained."""
    shown = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not select.select([leader], [], [], 0.2)[0]:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        shown += chunk
        if until is not None and until in shown:
            return shown
    return shown


def _on_a_terminal(db: Any, *args: str, cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """``reactor --db DB ARGS`` with stderr on a terminal; the process and the
    terminal's other side."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "reactor", "--db", str(db), *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            env={**CLI_ENV, "TERM": "xterm-256color"},
        )
    finally:
        os.close(follower)
    return process, leader


def test_ctrl_c_during_an_import_leaves_all_or_nothing(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("before").set("k", 1)
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(_lines(200_000, scopes=7)) + "\n", encoding="utf-8")
    process, leader = _on_a_terminal(db_path, "import", str(big), cwd=tmp_path)
    try:
        # The bar's "importing" stage is drawn from inside the write transaction.
        shown = _read_terminal(leader, process, b"importing")
        assert b"importing" in shown, shown[-500:]
        process.send_signal(signal.SIGINT)
        shown += _read_terminal(leader, process, None)
        process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(leader)
    keys = _count_keys(db_path)
    assert keys in (1, 200_001), keys  # never a part
    if keys == 1:
        assert process.returncode == 1
        assert b"Aborted" in shown


def _import_interrupted(
    db: Any, file: Path, cwd: Path, when: Callable[[], None], sent: int = signal.SIGINT
) -> tuple[int, str]:
    """``reactor import FILE`` sent ``sent`` once ``when`` returns: its exit status and
    output (stdout and stderr)."""
    # Ctrl-C as on a terminal, whatever this process inherited: a job a shell started
    # in the background ignores SIGINT, and so would its children.
    command = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        " sys.argv[0] = 'reactor'; runpy.run_module('reactor', run_name='__main__')"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", command, "--db", str(db), "import", str(file)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=CLI_ENV,
    )
    try:
        when()
        if process.poll() is None:
            process.send_signal(sent)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, output


def test_ctrl_c_at_any_moment_of_an_import_never_hides_its_commit(
    db_path: Any, tmp_path: Path
) -> None:
    """Item 3 of issue 22: a Ctrl-C right after the commit used to end the import with
    "Aborted!" and status 1 although everything was imported (a rerun then adds every
    job without an idempotency key again). Once committed, the import reports success;
    before, it leaves nothing. SIGINT at random moments, and just as the commit shows."""
    count = 20_000
    lines = _lines(count, scopes=5)
    lines += [json.dumps({"queue": "q", "item": n}) for n in range(20)]
    source = tmp_path / "source.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    started = time.monotonic()
    assert (
        run_reactor(
            "--db", str(tmp_path / "timing.db"), "import", str(source), cwd=tmp_path
        ).returncode
        == 0
    )
    whole = time.monotonic() - started

    def committed() -> bool:
        return raw_query(db_path, "SELECT count(*) FROM reactor_kv")[0][0] > 1

    def at_the_commit() -> None:
        deadline = time.monotonic() + 60
        while not committed() and time.monotonic() < deadline:
            time.sleep(0.002)

    rng = random.Random(22)
    moments: list[Callable[[], None]] = [at_the_commit] * 3
    delays = [rng.uniform(0.2, 1.1) * whole for _ in range(5)]
    moments += [lambda d=delay: time.sleep(d) for delay in delays]
    outcomes = []
    for when in moments:
        with reactor.open(db_path) as state:
            state.scope("before").set("k", 1)
            state.scope("before").clear()  # a database holding no key, its schema made
        status, output = _import_interrupted(db_path, source, tmp_path, when)
        keys = raw_query(db_path, "SELECT count(*) FROM reactor_kv")[0][0]
        jobs = raw_query(db_path, "SELECT count(*) FROM reactor_jobs")[0][0]
        outcomes.append((status, keys))
        assert (keys, jobs) in ((0, 0), (count, 20)), (keys, jobs, output[-500:])  # never a part
        if keys:  # committed: said so, with status 0, whatever came after
            assert status == 0, output[-800:]
            summary = json.loads(output.splitlines()[0])
            assert (summary["keys"], summary["jobs"]) == (count, 20), output[-800:]
        else:
            assert status != 0, output[-800:]
        raw_query(db_path, "DELETE FROM reactor_kv")
        raw_query(db_path, "DELETE FROM reactor_jobs")
    assert any(keys for _, keys in outcomes[:3]), outcomes  # the commit was reached


def test_an_import_killed_at_random_moments_is_all_or_nothing(db_path: Any, tmp_path: Path) -> None:
    count = 20_000
    source = tmp_path / "source.jsonl"
    source.write_text("\n".join(_lines(count, scopes=5)) + "\n", encoding="utf-8")
    started = time.monotonic()
    timed = run_reactor("--db", str(tmp_path / "timing.db"), "import", str(source), cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    whole = time.monotonic() - started
    rng = random.Random(9)
    seen = set()
    for delay in [rng.uniform(0.3, 1.2) * whole for _ in range(5)]:
        with reactor.open(db_path) as state:
            state.scope("before").set("k", 1)
            state.scope("before").clear()
        status, _ = _import_interrupted(
            db_path, source, tmp_path, lambda d=delay: time.sleep(d), signal.SIGKILL
        )
        keys = raw_query(db_path, "SELECT count(*) FROM reactor_kv")[0][0]
        assert keys in (0, count), keys
        seen.add((status, keys))
        raw_query(db_path, "DELETE FROM reactor_kv")
    assert seen, seen


# -- timers and queues -------------------------------------------------------------
def _fill_timers_and_queues(state: reactor.State) -> dict[str, reactor.Timer]:
    """``_fill``'s keys, timers (a value and ops, one-shot and recurring) and two
    queues: jobs ready, delayed, dead and taken (one with attempts left, one without),
    some with idempotency keys. The clock stands still: nothing fires or runs out."""
    _fill(state)
    timers = {
        "once": state.scope("orders").schedule("reminder", {"due": True}, after=30),
        "beat": state.scope("orders").schedule("beats", ops=[ops.increment("")], every=60),
        "other": state.scope("cache").schedule("rate", 1.5, after=90, every=3600),
    }
    emails = state.queue("emails", max_attempts=3)
    emails.put("a")
    emails.put("b", delay=20, key="kb")
    emails.put("c", key="kc")
    taken = emails.take(timeout=0)  # "a": its take counted, its lease still running
    assert taken is not None
    assert (taken.item, taken.attempts) == ("a", 1)
    fragile = state.queue("fragile", max_attempts=1)
    fragile.put("x")
    first = fragile.take(timeout=0)
    assert first is not None
    first.nack()  # its one attempt spent: dead
    fragile.put("y", key="ky")
    assert fragile.take(timeout=0) is not None  # its last attempt, under a lease
    assert fragile.stats() == {
        "ready": 0,
        "delayed": 0,
        "taken": 1,
        "dead": 1,
        "taken_by_group": {},
        "rate_window": 0,
    }
    return timers


def _job(queue: str, item: Any, attempts: int, state: str, ready_in: float, key: Any) -> Any:
    """A job's line of an export, as parsed."""
    return {
        "queue": queue,
        "item": item,
        "attempts": attempts,
        "state": state,
        "ready_in": ready_in,
        "key": key,
    }


def _timer(timer: reactor.Timer, what: str, writes: Any, due_in: float) -> Any:
    """A timer's line of an export, as parsed."""
    return {
        "timer": timer.id,
        "scope": timer.scope,
        "key": timer.key,
        what: writes,
        "due_in": due_in,
        "every": timer.every,
    }


def _max_attempts(state: reactor.State, queue: str) -> int | None:
    found = engine_of(state).store.reader().jobs().queue(queue)
    return None if found is None else found.max_attempts


def _took(queue: reactor.Queue) -> tuple[Any, int] | None:
    """The item and attempts of the job a take gets now (acknowledged), or None."""
    job = queue.take(timeout=0)
    if job is None:
        return None
    job.ack()
    return job.item, job.attempts


def _good_lines() -> list[str]:
    return [
        json.dumps({"scope": "s", "key": "k", "value": 1}),
        json.dumps({"timer": "t1", "scope": "s", "key": "k", "value": 2, "due_in": 5}),
        json.dumps({"queue": "q", "max_attempts": 2}),
        json.dumps(_job("q", "item", 0, "ready", 0.0, None)),
    ]


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


_TIMER = {"timer": "t2", "scope": "s", "key": "k", "value": 1, "due_in": 5, "every": None}
_OPS_TIMER = {**{k: v for k, v in _TIMER.items() if k != "value"}, "ops": [ops.increment("n")]}
_JOB = _job("q", "item", 0, "ready", 0.0, None)


# -- progress ----------------------------------------------------------------------
def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_a_short_run_draws_no_bar() -> None:
    console, out = _terminal()
    bar = Bar(console)
    bar.start("reading", None)
    bar.advance(SHOW_FROM)
    bar.start("importing", SHOW_FROM)
    bar.advance(SHOW_FROM)
    bar.start("committing", None)
    bar.close()
    assert out.getvalue() == ""


def test_a_long_run_draws_a_bar_for_each_stage() -> None:
    console, out = _terminal()
    bar = Bar(console)
    bar.start("reading", None)
    bar.advance(SHOW_FROM)
    assert out.getvalue() == ""
    bar.advance(1000)  # past the threshold: the bar shows, and stays for later stages
    bar.start("importing", 10)
    bar.advance(10)
    bar.start("committing", None)
    bar.close()
    drawn = out.getvalue()
    for stage in ("reading", "importing", "committing"):
        assert stage in drawn
    assert "6,000" in drawn


def test_progress_shows_on_a_terminal_only(db_path: Any, tmp_path: Path) -> None:
    lines = tmp_path / "lines.jsonl"
    lines.write_text("\n".join(_lines(SHOW_FROM + 1000)) + "\n", encoding="utf-8")
    process, leader = _on_a_terminal(db_path, "import", str(lines), cwd=tmp_path)
    try:
        shown = _read_terminal(leader, process, None)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(leader)
    assert process.returncode == 0, shown
    assert json.loads(out) == {
        "imported": SHOW_FROM + 1000,
        **_keys_only(SHOW_FROM + 1000),
        "skipped": 0,
    }
    assert b"importing" in shown

    process, leader = _on_a_terminal(db_path, "export", "backup.jsonl", cwd=tmp_path)
    try:
        shown = _read_terminal(leader, process, None)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(leader)
    assert process.returncode == 0, shown
    assert json.loads(out) == {
        "exported": SHOW_FROM + 1000,
        **_keys_only(SHOW_FROM + 1000),
        "file": "backup.jsonl",
    }
    assert b"exporting" in shown

    # Piped, as in every other test: nothing on stderr.
    done = run_reactor("--db", str(db_path), "import", str(lines), cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    done = run_reactor("--db", str(db_path), "export", "again.jsonl", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
