"""Files that are not what reactor expects, and a database file changing under a
running engine (SPEC §1, §8).

- A file that is not a reactor database (text, random bytes, another application's
  SQLite database, a truncated one), or one from a newer reactor, raises a typed error
  and is left byte-for-byte untouched: same content, size and modification time.
- What is not a regular file (a folder, a FIFO, a socket), a path under a regular
  file, a blocked default folder: ``StorageError``, and nothing created beside it.
- The database file removed, renamed or replaced while open: writes fail with
  ``StorageError``; none is acknowledged into a file no other process can see; the
  file now at the path is not damaged, and a new ``open()`` works on it.
- Several processes opening a brand-new file, or an old one to migrate, at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reactor

from .conftest import run_reactor

pytestmark = pytest.mark.sqlite_only("database files")

ROOT = Path(__file__).resolve().parent.parent


def _fingerprint(path: Path) -> tuple[str, int, int, int]:
    """What "byte-for-byte untouched" compares: content, size, mtime, mode."""
    found = path.stat()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, found.st_size, found.st_mtime_ns, found.st_mode


def _reactor_database(path: Path, **values: Any) -> None:
    with reactor.open(path) as state:
        state.scope("s").set_many(values or {"k": "v"})


def _sqlite(path: Path, *statements: str, wal: bool = False) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    for statement in statements:
        conn.execute(statement)
    conn.close()


def _truncated(path: Path, keep: Callable[[int], int]) -> None:
    _reactor_database(path, **{f"k{i}": "x" * 200 for i in range(200)})
    data = path.read_bytes()
    path.write_bytes(data[: keep(len(data))])


def _newer(path: Path, *, wal: bool) -> None:
    _reactor_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE reactor_meta SET value = 99 WHERE name = 'schema_version'")
    if not wal:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()


NOT_REACTOR: dict[str, tuple[Callable[[Path], None], type[reactor.ReactorError]]] = {
    "a text file": (
        lambda p: p.write_text("name,value\n" + "a,1\n" * 500),
        reactor.StorageError,
    ),
    "random bytes": (lambda p: p.write_bytes(os.urandom(16384)), reactor.StorageError),
    "a few random bytes": (lambda p: p.write_bytes(os.urandom(37)), reactor.StorageError),
    "another application's SQLite database": (
        lambda p: _sqlite(
            p,
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO users VALUES (1, 'ada')",
        ),
        reactor.StorageError,
    ),
    "another application's SQLite database in WAL mode": (
        lambda p: _sqlite(p, "CREATE TABLE jobs (id INTEGER PRIMARY KEY)", wal=True),
        reactor.StorageError,
    ),
    "another application's table named reactor_meta": (
        lambda p: _sqlite(p, "CREATE TABLE reactor_meta (name TEXT, value TEXT)"),
        reactor.StorageError,
    ),
    "an empty SQLite database another application marked": (
        lambda p: _sqlite(p, "PRAGMA user_version = 7"),
        reactor.StorageError,
    ),
    "a reactor database cut in half": (
        lambda p: _truncated(p, lambda size: size // 2),
        reactor.StorageError,
    ),
    "a reactor database cut to its header": (
        lambda p: _truncated(p, lambda _: 100),
        reactor.StorageError,
    ),
    "a newer reactor database (WAL)": (lambda p: _newer(p, wal=True), reactor.SchemaError),
    "a newer reactor database (rollback journal)": (
        lambda p: _newer(p, wal=False),
        reactor.SchemaError,
    ),
}


def _refuse(how: str, path: Path, error: type[reactor.ReactorError]) -> None:
    """Open ``path`` as ``how`` says, and check that it is refused with ``error``."""
    if how.startswith("cli"):
        command = ["get", "s", "k"] if how == "cli get" else ["set", "s", "k", "1"]
        done = run_reactor(*command, "--db", str(path), cwd=path.parent)
        assert done.returncode != 0, done.stdout
        assert done.stderr.startswith("Error:"), done.stderr
        return
    with pytest.raises(error) as caught:
        reactor.open(path, readonly=how == "readonly")
    assert not isinstance(caught.value, reactor.BusyError)


@pytest.mark.parametrize("how", ["open", "readonly", "cli get", "cli set"])
@pytest.mark.parametrize("case", list(NOT_REACTOR))
def test_a_file_that_is_not_a_current_reactor_database_is_refused_untouched(
    case: str, how: str, tmp_path: Path
) -> None:
    """Nothing changes in the folder: the file keeps its bytes and mtime, and nothing
    appears beside it. Before the fix, another application's database got reactor's
    tables, a rollback-journal file was switched to WAL (its header rewritten) before
    the version check refused it, and a database in WAL mode was left with a -wal and
    a -shm file (made by the read-only connection that checked its version)."""
    make, error = NOT_REACTOR[case]
    path = tmp_path / "state.db"
    make(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    before = _fingerprint(path)
    for _ in range(2):  # and again: the first attempt left nothing that changes the second
        _refuse(how, path, error)
        assert _fingerprint(path) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]


# A process that commits and dies without closing: its commits stay in the WAL.
CRASHER = """
import os, sys, reactor
state = reactor.open(sys.argv[1])
state.scope("s").set_many({f"k{i}": i for i in range(100)})
state.scope("s").set("last", "committed")
os._exit(0)
"""


def _in_the_file_alone(path: Path) -> set[str]:
    """The keys the database file holds by itself (read ``immutable=1``: no WAL)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return {key for (key,) in conn.execute("SELECT key FROM reactor_kv")}
    except sqlite3.OperationalError:  # no table yet: the schema is in the WAL too
        return set()
    finally:
        conn.close()


@pytest.mark.parametrize("fresh", [True, False], ids=["a new database", "an existing one"])
@pytest.mark.parametrize("shm", [True, False], ids=["with its -shm", "its -shm gone"])
def test_commits_a_crash_left_in_the_wal_are_all_there_after_open(
    fresh: bool, shm: bool, tmp_path: Path
) -> None:
    """The version check before opening reads a database whose WAL is there through
    that WAL (not the database file alone), and neither loses nor hides a commit."""
    path = tmp_path / "state.db"
    if not fresh:
        _reactor_database(path, old=1)
    subprocess.run([sys.executable, "-c", CRASHER, str(path)], check=True, timeout=60)
    assert Path(f"{path}-wal").stat().st_size > 0
    assert "last" not in _in_the_file_alone(path)  # in the WAL only
    if not shm:
        Path(f"{path}-shm").unlink()
    expected = {f"k{i}": i for i in range(100)} | {"last": "committed"}
    if not fresh:
        expected["old"] = 1
    if shm:  # a read-only open reads the WAL too (without its -shm, only a writer can)
        with reactor.open(path, readonly=True) as state:
            assert state.scope("s").list() == expected
    with reactor.open(path) as state:
        assert state.scope("s").list() == expected
        state.scope("s").set("after", True)
    with reactor.open(path) as state:
        assert state.scope("s").list() == expected | {"after": True}


def test_a_zero_length_file_is_a_new_database(tmp_path: Path) -> None:
    """What a crash right after creating the file leaves: SQLite's own reading."""
    path = tmp_path / "state.db"
    path.touch()
    with reactor.open(path) as state:
        state.scope("s").set("k", 1)
    with reactor.open(path) as state:
        assert state.scope("s").get("k") == 1


@pytest.mark.parametrize("name", ["a b.db", "q?x=1.db", "h#1.db", "p%20c.db", "ünï€.db"])
def test_file_names_with_uri_characters(name: str, tmp_path: Path) -> None:
    """Connections open the file by a SQLite URI (``mode=rw``): the name is quoted."""
    path = tmp_path / name
    with reactor.open(path) as state:
        state.scope("s").set("k", name)
    with reactor.open(path) as state:
        assert state.scope("s").get("k") == name
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


# -- what is not a regular file --------------------------------------------------------------
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


NOT_A_FILE: dict[str, Callable[[Path], Any]] = {
    "a folder": lambda p: p.mkdir(),
    "a FIFO": _fifo,
    "a socket": _socket,
    "a symbolic link to itself": lambda p: p.symlink_to(p),
}


@pytest.mark.parametrize("case", list(NOT_A_FILE))
def test_what_is_not_a_regular_file_is_refused(case: str, tmp_path: Path) -> None:
    """Before the fix a FIFO (or /dev/null) went to SQLite, which, as root, created a
    ``-journal`` file beside it."""
    path = tmp_path / "state.db"
    NOT_A_FILE[case](path)
    beside = sorted(tmp_path.iterdir())
    with pytest.raises(reactor.StorageError):
        reactor.open(path)
    assert sorted(tmp_path.iterdir()) == beside


def test_a_path_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    with pytest.raises(reactor.StorageError):
        reactor.open(tmp_path / "plain" / "state.db")
    with pytest.raises(reactor.StorageError):
        reactor.open(tmp_path / "plain" / "deeper" / "state.db")
    assert (tmp_path / "plain").read_text() == "not a folder"


def test_a_symbolic_link_to_a_database_file_yet_to_be_made_creates_it(tmp_path: Path) -> None:
    (tmp_path / "link.db").symlink_to(tmp_path / "real.db")
    with reactor.open(tmp_path / "link.db") as state:
        state.scope("s").set("k", 1)
    assert (tmp_path / "real.db").stat().st_size > 0


def _immutable(path: Path) -> None:
    """``chattr +i``: not even root may change it (root ignores file modes)."""
    try:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"chattr +i is not available here: {exc}")


def _mutable(path: Path) -> None:
    subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True, timeout=10)


def test_an_unwritable_folder_or_file_gives_typed_errors(tmp_path: Path) -> None:
    """A folder nothing can be created in (no -wal, no -shm, no new file), and a
    database file that cannot be written: StorageError, never an OSError (ReadOnlyError
    for a database that is there, before anything is made beside it); opened with
    readonly=True, it still reads."""
    folder = tmp_path / "frozen"
    _reactor_database(folder / "state.db")
    _reactor_database(tmp_path / "readonly.db", k="kept")
    for name in ("-wal", "-shm"):
        assert not Path(f"{tmp_path / 'readonly.db'}{name}").exists()
    _immutable(folder)
    try:
        for path in (folder / "state.db", folder / "new.db", folder / "sub" / "new.db"):
            with pytest.raises(reactor.StorageError):
                reactor.open(path)
    finally:
        _mutable(folder)
    readonly = tmp_path / "readonly.db"
    before = _fingerprint(readonly)
    _immutable(readonly)
    try:
        with pytest.raises(reactor.ReadOnlyError, match="readonly=True"):
            reactor.open(readonly)
        with reactor.open(readonly, readonly=True) as state:
            assert state.scope("s").get("k") == "kept"
            with pytest.raises(reactor.ReadOnlyError, match="readonly"):
                state.scope("s").set("k", "changed")
    finally:
        _mutable(readonly)
    assert _fingerprint(readonly) == before


# -- the default folder ---------------------------------------------------------------------
def test_a_blocked_default_folder_raises_storage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``~/.reactor`` is a regular file: before the fix, a raw FileExistsError."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".reactor").write_text("in the way")
    monkeypatch.delenv("REACTOR_DB", raising=False)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(reactor.StorageError, match=r"\.reactor"):
        reactor.open()
    with pytest.raises(reactor.StorageError):
        reactor.open(home / ".reactor" / "other.db")  # the same folder, named
    monkeypatch.setenv("REACTOR_DB", str(home / ".reactor" / "state.db"))
    with pytest.raises(reactor.StorageError):
        reactor.open()
    assert (home / ".reactor").read_text() == "in the way"


NO_HOME = """
    import os, sys, tempfile
    import reactor  # first: the interpreter's files may not be readable by that user
    with reactor.open(":memory:") as warm:  # what opening imports on first use
        warm.scope("s").set("k", 1)
    os.setgid(54321)
    os.setuid(54321)  # no passwd entry: "~" cannot be expanded
    try:
        reactor.open()
    except reactor.StorageError as exc:
        print("StorageError", exc)
    os.environ["REACTOR_DB"] = sys.argv[1]
    with reactor.open() as state:  # REACTOR_DB needs no home folder
        state.scope("s").set("k", 1)
    print("opened")
"""


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root")
def test_no_home_folder_at_all_raises_storage_error() -> None:
    """No $HOME and no passwd entry: before the fix, a raw RuntimeError, even with
    REACTOR_DB set."""
    folder = Path(tempfile.mkdtemp(prefix="reactor-no-home-"))  # one that user can reach
    try:
        folder.chmod(0o777)
        env = {k: v for k, v in os.environ.items() if k not in ("HOME", "REACTOR_DB")}
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(NO_HOME), str(folder / "state.db")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,  # the reactor under test
            env=env,
        )
    finally:
        shutil.rmtree(folder)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[0].startswith("StorageError"), run.stdout
    assert run.stdout.splitlines()[-1] == "opened"


# -- the file changes under a running engine ------------------------------------------------
def _unlink(path: Path) -> None:
    path.unlink()


def _rename(path: Path) -> None:
    path.rename(path.with_name("moved.db"))


def _replace_with_another(path: Path) -> None:
    other = path.with_name("other.db")
    _reactor_database(other, k="other")
    os.replace(other, path)


def _replace_with_a_copy(path: Path) -> None:
    """Same bytes, another file: what a backup restored over a running database is."""
    copy = path.with_name("copy.db")
    conn = sqlite3.connect(path)
    target = sqlite3.connect(copy)
    conn.backup(target)
    target.close()
    conn.close()
    os.replace(copy, path)


def _unlink_wal(path: Path) -> None:
    Path(f"{path}-wal").unlink()


def _unlink_all(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink()


CHANGES: dict[str, Callable[[Path], None]] = {
    "removed": _unlink,
    "renamed": _rename,
    "replaced by another database": _replace_with_another,
    "replaced by a copy of itself": _replace_with_a_copy,
    "its WAL removed": _unlink_wal,
    "removed with its WAL and shared memory": _unlink_all,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_database_file_changed_while_open_fails_writes(change: str, tmp_path: Path) -> None:
    """Before the fix every write was acknowledged, into an unlinked inode (or a WAL
    nobody would read again): lost at the close."""
    path = tmp_path / "state.db"
    state = reactor.open(path)
    try:
        scope = state.scope("s")
        scope.set_many({f"k{i}": i for i in range(50)})
        CHANGES[change](path)
        if change == "its WAL removed":
            # The writer still holds it: the first commit to notice is checkpointed into
            # the database file (with everything acknowledged before), and stands.
            scope.set("noticed", True)
        for attempt in range(3):
            with pytest.raises(reactor.StorageError, match="removed or replaced"):
                scope.set("after", attempt)
        with pytest.raises(reactor.StorageError):
            scope.increment("counter")
        with pytest.raises(reactor.StorageError), scope.transaction() as tx:
            tx.set("in-transaction", 1)
        with contextlib.suppress(reactor.StorageError):  # reads may answer, or fail typed
            scope.get("k1")
    finally:
        state.close()
    if change == "replaced by another database":
        with reactor.open(path) as again:  # what replaced it is intact
            assert again.scope("s").keys() == ["k"]
            assert again.scope("s").get("k") == "other"
    if path.exists():
        with reactor.open(path) as again:
            assert again.scope("s").get("after") is None
            if change in ("its WAL removed", "replaced by a copy of itself"):
                assert again.scope("s").get_many([f"k{i}" for i in range(50)]) == {
                    f"k{i}": i for i in range(50)
                }
            if change == "its WAL removed":
                assert again.scope("s").get("noticed") is True
            _ok(again)


def _ok(state: reactor.State) -> None:
    state.scope("ok").set("k", 1)
    assert state.scope("ok").get("k") == 1


def test_open_after_the_file_was_replaced_starts_an_engine_on_the_new_file(
    tmp_path: Path,
) -> None:
    """A handle opened before the change keeps failing; one opened after works on
    what is at the path now, while the first is still open."""
    path = tmp_path / "state.db"
    first = reactor.open(path)
    try:
        first.scope("s").set("k", "first")
        _replace_with_another(path)
        with reactor.open(path) as second:
            assert second.scope("s").get("k") == "other"
            second.scope("s").set("k", "second")
            with pytest.raises(reactor.StorageError):
                first.scope("s").set("k", "lost")
    finally:
        first.close()
    with reactor.open(path) as state:
        assert state.scope("s").get("k") == "second"


def test_a_renamed_database_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """Writes acknowledged before the rename are in the WAL: reactor checkpoints it
    into the renamed file when it notices, so nothing acknowledged stays behind in a
    WAL that no longer goes with its database file."""
    path = tmp_path / "state.db"
    with reactor.open(path) as state:
        scope = state.scope("s")
        scope.set_many({f"k{i}": i for i in range(100)})
        path.rename(tmp_path / "moved.db")
        with pytest.raises(reactor.StorageError):
            scope.set("k", "refused")
        assert not Path(f"{path}-wal").exists()  # nothing left for a new file here
    with reactor.open(tmp_path / "moved.db") as state:
        assert state.scope("s").get_many([f"k{i}" for i in range(100)]) == {
            f"k{i}": i for i in range(100)
        }


def test_a_file_removed_while_open_is_not_recreated_empty(tmp_path: Path) -> None:
    """Before the fix, a connection opened after the removal (a reader, the follower)
    created an empty file at the path, which then looked like a new database."""
    path = tmp_path / "state.db"
    with reactor.open(path) as state:
        state.scope("s").set("k", 1)
        _unlink_all(path)
        for _ in range(4):  # readers open new connections: none creates the file
            with contextlib.suppress(reactor.StorageError):
                state.scope(f"s{_}").keys()
    assert not path.exists()
    assert sorted(tmp_path.iterdir()) == []


# -- several processes at once --------------------------------------------------------------
OPENER = """
    import sys, time, reactor
    path, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))
    with reactor.open(path) as state:
        state.scope("s").increment("opened")
        state.scope("s").set(name, True)
    print("ok")
"""


def _at_once(path: Path, count: int) -> None:
    import time

    start = time.time() + 1.0  # the interpreters are up by then: they start together
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(OPENER), str(path), f"p{i}", str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(count)
    ]
    for child in children:
        try:
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
        assert child.returncode == 0, err[-3000:]
        assert out.strip() == "ok"


def test_a_copy_of_an_open_database_is_a_database_of_its_own(tmp_path: Path) -> None:
    """``cp`` of a running database (with its WAL) opens as an independent database."""
    path = tmp_path / "state.db"
    with reactor.open(path) as state:
        state.scope("s").set("k", "original")
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{path}{suffix}", tmp_path / f"copy.db{suffix}")
        with reactor.open(tmp_path / "copy.db") as copy:
            assert copy.scope("s").get("k") == "original"
            copy.scope("s").set("k", "copy")
        assert state.scope("s").get("k") == "original"


def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys, time, reactor
        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
        state = reactor.open(sys.argv[1], timeout=20)
        state.scope("s").increment("opened")
        state.close()
        """
    )
    for round_ in range(3):
        path = tmp_path / f"new-{round_}.db"
        start = time.time() + 1.5
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(path), str(start)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        errors = [run.communicate(timeout=60)[1] for run in runs]
        assert [run.returncode for run in runs] == [0, 0, 0, 0], errors
        with reactor.open(path) as state:
            assert state.scope("s").get("opened") == 4
