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
from reactor import _exchange
from reactor._cli_progress import SHOW_FROM, Bar
from reactor._engine import engine_of
from reactor._store import Row, WriteTxn
from reactor.errors import InvalidArgumentError, InvalidValueError
from tests.conftest import CLI_ENV, run_reactor, wait_for


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
    assert _exchange.dump_file(state, target) == 5
    after = os.stat(target)
    assert target.read_text(encoding="utf-8") == _dumped(state)
    assert after.st_ino != before.st_ino  # a new file took its place: replaced, not rewritten
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert sorted(os.listdir(out_dir)) == ["backup.jsonl"]


def test_export_to_a_new_file(state: reactor.State, out_dir: Path) -> None:
    _fill(state)
    assert _exchange.dump_file(state, out_dir / "new.jsonl") == 5
    assert (out_dir / "new.jsonl").read_text(encoding="utf-8") == _dumped(state)
    assert sorted(os.listdir(out_dir)) == ["new.jsonl"]


def test_a_failed_export_leaves_the_regular_file_as_it_was(
    state: reactor.State, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(state)
    target = out_dir / "backup.jsonl"
    target.write_text("old\n", encoding="utf-8")
    real = _exchange.entries

    def failing(*args: Any) -> Any:
        yield from list(real(*args))[:2]
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(_exchange, "entries", failing)
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
    assert _exchange.dump_file(state, link) == 5
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
    assert _exchange.dump_file(state, fifo) == 5
    reader.join(10)
    assert not reader.is_alive()
    assert read == [_dumped(state).encode()]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(out_dir) == ["pipe"]


def test_export_to_dev_null_leaves_it_a_device(state: reactor.State) -> None:
    _fill(state)
    before = os.lstat("/dev/null")
    assert _exchange.dump_file(state, "/dev/null") == 5
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
    assert json.loads(done.stdout) == {"exported": 5, "file": "/dev/null"}
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
    assert json.loads(out) == {"exported": 5, "file": str(fifo)}
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
    assert _exchange.load(state, lines) == 2501
    monkeypatch.undo()
    assert commits == [2501]
    wait_for(lambda: len(events) == 2501)
    assert events.count(("updated", "orders", "o-1")) == 1
    assert sum(kind == "created" for kind, _, _ in events) == 2500
    assert state.scope("s1").get("k1") == {"n": 1}
    assert state.scope("s0").ttl("k0") == 60.0  # counted from the commit's (fake) clock
    assert state.scope("s1").ttl("k1") == -1


def test_a_key_given_twice_takes_its_last_entry(state: reactor.State) -> None:
    lines = [
        json.dumps({"scope": "s", "key": "k", "value": 1, "ttl": 5}),
        json.dumps({"scope": "s", "key": "k", "value": 2}),
    ]
    assert _exchange.load(state, lines) == 1
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
    assert _exchange.load(state, lines) == 3001
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
    assert json.loads(out) == {"imported": SHOW_FROM + 1000}
    assert b"importing" in shown

    process, leader = _on_a_terminal(db_path, "export", "backup.jsonl", cwd=tmp_path)
    try:
        shown = _read_terminal(leader, process, None)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(leader)
    assert process.returncode == 0, shown
    assert json.loads(out) == {"exported": SHOW_FROM + 1000, "file": "backup.jsonl"}
    assert b"exporting" in shown

    # Piped, as in every other test: nothing on stderr.
    done = run_reactor("--db", str(db_path), "import", str(lines), cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    done = run_reactor("--db", str(db_path), "export", "again.jsonl", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
