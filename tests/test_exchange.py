"""Export and import (``_exchange``, and the commands over it): where an export may
write, an import that applies all of it or nothing, and progress on a terminal.

In-process tests call ``_exchange`` on the test's database; the command line is driven
in a subprocess, as in ``test_cli``.
"""

from __future__ import annotations

import io
import json
import os
import pty
import random
import re
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import reactor
from reactor import ops
from reactor._backup import exchange as _exchange
from reactor._backup.exchange import Tally
from reactor._backup.export import ExportView
from reactor._storage.records import Row
from reactor._storage.sql_text import STREAMED_ROWS
from reactor._storage.store import WriteTxn
from reactor._work import jobs as _jobs
from reactor.cli.progress import SHOW_FROM, Bar
from reactor.errors import InvalidArgumentError, InvalidValueError
from reactor.testing import ManualClock, run_upkeep
from tests.conftest import CLI_ENV, engine_of, raw_query, run_reactor, wait_for


def _fill(state: reactor.State, *, ttl: float | None = 300) -> None:
    """Five keys; one with ``ttl`` (None: a subprocess's export is compared whole,
    and time passes on its clock)."""
    state.scope("orders").set_many({"o-1": {"total": 120}, "o-2": None, "o-3": [1, 2.0]})
    state.scope("cache").set("rate", 1.08, ttl=ttl)
    state.scope("flags").set("on", True)


def _dumped(state: reactor.State) -> str:
    """Every key of the database, as an export writes it."""
    out = io.StringIO()
    _exchange.dump(state, out)
    return out.getvalue()


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


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A directory for export targets, apart from the database file."""
    path = tmp_path / "out"
    path.mkdir()
    return path


# -- export: where it writes -------------------------------------------------------
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


# -- export: the command line ------------------------------------------------------
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


def test_the_export_command_refuses_a_directory(db_path: Any, out_dir: Path) -> None:
    with reactor.open(db_path) as state:
        _fill(state)
    (out_dir / "dir").mkdir()
    done = run_reactor("--db", str(db_path), "export", "dir", cwd=out_dir)
    assert done.returncode == 2, done.stderr
    assert "is a directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert os.listdir(out_dir / "dir") == []


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


def _bank(state: reactor.State) -> None:
    """Two scopes that transfers move money between, with keys enough between them
    that an export fetches them a few at a time, over several fetches."""
    state.scope("a").set_many({"balance": TOTAL, "moves": 0})
    state.scope("z").set_many({"balance": 0, "moves": 0})
    filler = 2_100
    assert filler > 4 * STREAMED_ROWS  # read over several fetches
    state.scope("m").set_many({f"k{n:05}": n for n in range(filler)})


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


# -- import: all or nothing --------------------------------------------------------
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
    assert fragile.stats() == {"ready": 0, "delayed": 0, "taken": 1, "dead": 1}
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
    return None if found is None else found[0]


def _took(queue: reactor.Queue) -> tuple[Any, int] | None:
    """The item and attempts of the job a take gets now (acknowledged), or None."""
    job = queue.take(timeout=0)
    if job is None:
        return None
    job.ack()
    return job.item, job.attempts


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
    assert emails.stats() == {"ready": 2, "delayed": 1, "taken": 0, "dead": 0}
    assert fragile.stats() == {"ready": 0, "delayed": 0, "taken": 0, "dead": 2}
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
    lines = [
        json.dumps({"scope": scope, "key": "1", "value": {"state": "ready"}}),
        json.dumps({**_TIMER, "scope": scope}),
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
    assert state.queue("q").stats() == {"ready": 1, "delayed": 0, "taken": 0, "dead": 0}
    assert _max_attempts(state, "q") == 5
    assert state.stats()["revision"] == revision
    assert _exchange.load(state, lines) == Tally(keys=1, timers=2, queues=1, jobs=1501)


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
