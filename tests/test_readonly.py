"""Read-only engines (``open(..., readonly=True)``) and the command line's reading
commands, on a database the user may read but not write.

"Cannot write" is made two ways. Root ignores file modes, so as root the files and
their folder are made immutable (``chattr +i``: not even root may change them, nor
create a file in the folder); as any other user they are made read-only (0o444, the
folder 0o555). Two tests also run as another user (``nobody``, root only), one with a
writer of the file's owner at work meanwhile.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor.testing import ManualClock
from tests.conftest import CLI_ENV, backend, engine_of, raw_query, run_reactor, wait_for

Fingerprint = dict[str, tuple[str, int, int, int]]

SEED: dict[str, Any] = {"o-1": {"total": 120}, "o-2": {"total": 7}, "count": 2, "tags": ["a"]}


def _seed(db: Any, **options: Any) -> None:
    with reactor.open(db, **options) as state:
        orders = state.scope("orders")
        orders.set_many(SEED)
        orders.set("note", "kept", ttl=1000)


def _fingerprint(folder: Path) -> Fingerprint:
    """Every file of ``folder``: content, size, mtime, mode (a -wal or -shm made by a
    read shows as a new name)."""
    found: Fingerprint = {}
    for path in sorted(folder.iterdir()):
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found[path.name] = (digest, stat.st_size, stat.st_mtime_ns, stat.st_mode)
    return found


@contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """``folder`` and its files, unwritable by this process until the block ends."""
    files = sorted(folder.iterdir())
    if os.geteuid() == 0:
        paths = [str(path) for path in [*files, folder]]
        try:
            subprocess.run(["chattr", "+i", *paths], check=True, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"chattr +i is not available here: {exc}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *paths], check=False, capture_output=True, timeout=10)
        return
    modes = {path: path.stat().st_mode for path in [*files, folder]}
    for path in files:
        path.chmod(0o444)
    folder.chmod(0o555)
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


# -- the library ------------------------------------------------------------------------
def _in_transaction(state: reactor.State) -> None:
    with state.scope("orders").transaction() as tx:
        tx.increment("count")


WRITES: dict[str, Callable[[reactor.State], Any]] = {
    "set": lambda state: state.scope("orders").set("o-1", 1),
    "set_many": lambda state: state.scope("orders").set_many({"x": 1}),
    "delete": lambda state: state.scope("orders").delete("o-1"),
    "delete a missing key": lambda state: state.scope("orders").delete("none"),
    "clear": lambda state: state.scope("orders").clear(),
    "expire": lambda state: state.scope("orders").expire("o-1", 10),
    "increment": lambda state: state.scope("orders").increment("count"),
    "decrement": lambda state: state.scope("orders").decrement("count"),
    "append": lambda state: state.scope("orders").append("note", "!"),
    "compare_and_swap": lambda state: state.scope("orders").compare_and_swap("count", 2, 3),
    "push": lambda state: state.scope("orders").push("tags", "b"),
    "pop": lambda state: state.scope("orders").pop("tags"),
    "update": lambda state: state.scope("orders").update("o-1", [reactor.ops.set("total", 1)]),
    "a transaction": _in_transaction,
    "a lock": lambda state: state.lock("job", 5).acquire(),
    "a durable subscription": lambda state: state.subscribe(print, durable="billing"),
}


def test_a_read_only_handle_reads_everything(db_path: Any) -> None:
    _seed(db_path)
    with reactor.open(db_path, readonly=True) as state:
        orders = state.scope("orders")
        assert orders.get("o-1") == {"total": 120}
        assert orders.get_many(["o-2", "none"]) == {"o-2": {"total": 7}}
        assert orders.exists("count")
        assert orders.list() == {**SEED, "note": "kept"}
        assert orders.keys("o-*") == ["o-1", "o-2"]
        assert 990 < orders.ttl("note") <= 1000
        assert orders.length("tags") == 1
        assert orders.snapshot().revision == 5
        assert state.scopes() == ["orders"]
        assert state.stats()["keys"] == 5
        assert [event.key for event in state.changes()] == [*SEED, "note"]
        with state.watch(since=4) as watch:
            assert next(watch).key == "note"
        with orders.transaction() as tx:  # a transaction that only reads commits nothing
            assert tx.get("count") == 2


@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_of_a_read_only_handle_raises_read_only_error(write: str, db_path: Any) -> None:
    _seed(db_path)
    with reactor.open(db_path, readonly=True) as state:
        with pytest.raises(reactor.ReadOnlyError, match="read-only"):
            WRITES[write](state)
        assert state.scope("orders").list() == {**SEED, "note": "kept"}
        assert state.stats()["revision"] == 5
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes") == [(5,)]
    assert raw_query(db_path, "SELECT COUNT(*) FROM reactor_subscribers") == [(0,)]


def test_read_only_error_is_a_storage_error() -> None:
    assert issubclass(reactor.ReadOnlyError, reactor.StorageError)
    assert reactor.errors.ReadOnlyError is reactor.ReadOnlyError


def test_an_asyncio_handle_opens_read_only_too(db_path: Any) -> None:
    import asyncio

    _seed(db_path)

    async def main() -> None:
        async with reactor.aio.open(db_path, readonly=True) as state:
            assert await state.scope("orders").get("count") == 2
            with pytest.raises(reactor.ReadOnlyError):
                await state.scope("orders").set("count", 3)

    asyncio.run(main())


@pytest.mark.sqlite_only("SQLite's files")
@pytest.mark.parametrize("frozen", [False, True], ids=["writable", "unwritable"])
def test_a_read_only_engine_changes_no_file(frozen: bool, tmp_path: Path) -> None:
    """Nothing is written, nor made beside the database (no -wal, no -shm): in a folder
    it could write to, and in one it cannot."""
    folder = tmp_path / "data"
    db = folder / "state.db"
    _seed(db)
    before = _fingerprint(folder)
    assert list(before) == ["state.db"]
    with unwritable(folder) if frozen else _nothing():
        if frozen:
            with pytest.raises(reactor.ReadOnlyError, match="readonly=True"):
                reactor.open(db)
        with reactor.open(db, readonly=True) as state:
            seen: list[str] = []
            state.subscribe(lambda event: seen.append(event.key))
            with state.watch(since=0) as watch:
                assert next(watch).key == "o-1"
            assert state.scope("orders").get("count") == 2
            with pytest.raises(reactor.ReadOnlyError):
                state.scope("orders").set("count", 3)
            time.sleep(0.3)  # a follower's round, and a sweeper's, if it ran
    assert _fingerprint(folder) == before  # (its modes back, if they were changed)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


WRITER = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        print("open", flush=True)
        for line in sys.stdin:
            state.scope("s").set(line.strip(), line.strip())
            print("set", flush=True)
"""


@contextmanager
def _writer(db: Any) -> Iterator[Callable[[str], None]]:
    """Another process with ``db`` open to write: a function that sets a key there."""
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=CLI_ENV,
    ) as process:
        sent, answers = process.stdin, process.stdout
        assert sent is not None
        assert answers is not None
        assert answers.readline() == "open\n"

        def write(key: str) -> None:
            sent.write(key + "\n")
            sent.flush()
            assert answers.readline() == "set\n"

        try:
            yield write
        finally:
            sent.close()
            assert process.wait(timeout=30) == 0


@pytest.mark.parametrize("first", ["reader", "writer"])
def test_a_read_only_engine_sees_what_other_processes_write(first: str, db_path: Any) -> None:
    """Subscriptions, watches and reads of a read-only engine follow another process's
    writes: one that opened the database before the reader (SQLite: the reader shares
    its WAL index), and one that came after (the reader held an immutable snapshot,
    which it gives up when a writer appears), and after that writer left, another."""
    _seed(db_path)

    def follow(state: reactor.State, seen: list[str], write: Callable[[str], None]) -> None:
        for key in (f"{first}-1", f"{first}-2"):
            write(key)
            wait_for(lambda wanted=[key]: seen[-1:] == wanted)
            assert state.scope("s").get(key) == key

    if first == "writer":
        with _writer(db_path) as write, reactor.open(db_path, readonly=True) as state:
            seen: list[str] = []
            state.subscribe(lambda event: seen.append(event.key))
            follow(state, seen, write)
        return
    with reactor.open(db_path, readonly=True) as state:
        seen = []
        state.subscribe(lambda event: seen.append(event.key))
        with state.watch() as watch:
            with _writer(db_path) as write:
                follow(state, seen, write)
            assert [next(watch).key for _ in range(2)] == ["reader-1", "reader-2"]
        with _writer(db_path) as write:  # the writer left; another one comes
            write("again")
            wait_for(lambda: "again" in seen)
        assert state.scope("s").keys() == ["again", "reader-1", "reader-2"]


def test_a_read_only_engine_reads_what_a_writer_that_came_and_went_wrote(db_path: Any) -> None:
    """A read sees every write acknowledged before it began, here one of a process that
    opened the database, wrote and closed it (on SQLite, perhaps while the reader held
    an immutable snapshot: a read gives it up when the file has changed)."""
    _seed(db_path)
    with reactor.open(db_path, readonly=True) as state:
        assert state.scope("s").get("late") is None
        for value in (1, 2):
            done = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(WRITE_ONCE), str(db_path), str(value)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=CLI_ENV,
            )
            assert done.returncode == 0, done.stderr
            assert state.scope("s").get("late") == value


WRITE_ONCE = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        state.scope("s").set("late", int(sys.argv[2]))
"""


def test_a_read_only_engine_neither_sweeps_nor_compacts(db_path: Any, clock: ManualClock) -> None:
    with reactor.open(db_path, clock=clock) as state:
        state.scope("s").set("short", 1, ttl=1)
        state.scope("s").set("long", 1)
    clock.advance(5)
    with reactor.open(db_path, readonly=True, clock=clock, log_retention=1) as state:
        expired: list[str] = []
        state.subscribe(lambda event: expired.append(event.key), events="expired")
        assert state.scope("s").keys() == ["long"]  # past its deadline: not shown
        assert state.scope("s").get("short") is None
        engine = engine_of(state)
        assert engine.sweeper is None  # no background upkeep at all
        assert f"reactor-sweeper[{engine.key}]" not in {t.name for t in threading.enumerate()}
        time.sleep(0.6)  # two sweeps' time
        assert expired == []
        assert len(state.changes()) == 2
    assert raw_query(db_path, "SELECT key FROM reactor_kv WHERE key = 'short'") == [("short",)]


def test_a_read_only_open_creates_nothing(db_path: Any, request: pytest.FixtureRequest) -> None:
    """No file is made (SQLite), no table (PostgreSQL's empty schema)."""
    with pytest.raises(reactor.ReadOnlyError, match="does not create"):
        reactor.open(db_path, readonly=True)
    if backend(request.config) == "postgresql":
        tables = "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        assert raw_query(db_path, tables + "current_schema()") == []
    else:
        assert not Path(db_path).exists()
        assert list(Path(db_path).parent.iterdir()) == []


def test_readonly_must_agree_with_the_engine_open_in_this_process(db_path: Any) -> None:
    """``readonly`` is an option of the engine: a handle given another value than the
    running engine's is refused; one that leaves it out joins."""
    _seed(db_path)
    with reactor.open(db_path) as writer:
        with pytest.raises(reactor.InvalidArgumentError, match="readonly=False"):
            reactor.open(db_path, readonly=True)
        with reactor.open(db_path, readonly=False) as joined:
            joined.scope("s").set("k", 1)
    with reactor.open(db_path, readonly=True) as reader:
        with pytest.raises(reactor.InvalidArgumentError, match="readonly=True"):
            reactor.open(db_path, readonly=False)
        with reactor.open(db_path) as joined, pytest.raises(reactor.ReadOnlyError):
            joined.scope("s").set("k", 2)
        assert reader.scope("s").get("k") == 1
    assert writer.closed


@pytest.mark.parametrize(
    ("target", "options"),
    [
        (":memory:", {}),
        (":memory:shared", {}),
        ("sqlite://", {}),
        ("state.db", {"durability": "memory"}),
    ],
)
def test_readonly_in_memory_is_refused(target: str, options: dict[str, Any]) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="readonly=True"):
        reactor.open(target, readonly=True, **options)


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_readonly_is_a_bool(value: Any) -> None:
    with pytest.raises(reactor.InvalidArgumentError, match="readonly"):
        reactor.open(":memory:", readonly=value)


@pytest.mark.sqlite_only("file modes and users")
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to become nobody"
)
def test_another_user_reads_a_database_it_may_not_write_while_its_owner_writes() -> None:
    """The common case: a database in its owner's folder, readable by others. Another
    user (nobody) reads it, read-only, while the owner writes; the reader makes no file
    there (it could not), and follows the owner's commits."""
    base = Path(tempfile.mkdtemp(prefix="reactor-readonly-"))  # in /tmp: others may pass
    try:
        base.chmod(0o755)
        db = base / "state.db"
        _seed(db)
        db.chmod(0o644)  # the -wal and -shm files the owner makes take this mode too
        reader = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(AS_NOBODY), str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=CLI_ENV,
        )
        assert reader.stdin is not None
        assert reader.stdout is not None
        assert reader.stdout.readline() == "count 2\n"
        with reactor.open(db) as owner:
            owner.scope("orders").set("o-3", {"total": 1})
            reader.stdin.write("go\n")
            reader.stdin.flush()
            out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
        assert out.splitlines() == [
            "refused: cannot write the database",
            "seen o-3",
            "value {'total': 1}",
            "write refused",
        ]
        assert all(path.stat().st_uid == 0 for path in base.iterdir())
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False, timeout=30)


AS_NOBODY = """
    import os, sys, time
    import reactor
    with reactor.open(":memory:") as warm:  # what opening imports, imported while root
        warm.scope("s").set("k", 1)
    os.setgid(65534)
    os.setuid(65534)
    db = sys.argv[1]
    try:
        reactor.open(db)
    except reactor.ReadOnlyError as exc:
        refused = str(exc).partition(" /")[0]
    with reactor.open(db, readonly=True) as state:
        seen = []
        state.subscribe(lambda event: seen.append(event.key))
        print("count", state.scope("orders").get("count"), flush=True)
        sys.stdin.readline()  # the owner wrote o-3 meanwhile
        deadline = time.monotonic() + 20
        while "o-3" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        print("refused:", refused)
        print("seen", *seen)
        print("value", state.scope("orders").get("o-3"))
        try:
            state.scope("orders").set("o-4", 1)
        except reactor.ReadOnlyError:
            print("write refused")
"""


@pytest.mark.sqlite_only("file modes and users")
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root, to become nobody"
)
def test_another_user_runs_the_commands_on_a_read_only_file_and_folder() -> None:
    """The command line as nobody, on a file of mode 0o444 in a folder of mode 0o555:
    the reading commands work, the writing ones say why they cannot, and nothing changes."""
    base = Path(tempfile.mkdtemp(prefix="reactor-readonly-"))
    try:
        base.chmod(0o755)
        folder = base / "data"
        db = folder / "state.db"
        _seed(db)
        db.chmod(0o444)
        folder.chmod(0o555)
        before = _fingerprint(folder)
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(COMMANDS_AS_NOBODY), str(db)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=CLI_ENV,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            '{"total":120}',
            "exit 0",
            '["o-1","o-2"]',
            "exit 0",
            "exit 3",  # storage: the database cannot be written
        ]
        assert done.stderr.startswith(f"Error: cannot write the database {db} (permission")
        assert "Traceback" not in done.stderr
        assert _fingerprint(folder) == before
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False, timeout=30)


COMMANDS_AS_NOBODY = """
    import contextlib, os, sys, tempfile
    from reactor.cli import main
    db = sys.argv[1]
    commands = (["get", "orders", "o-1"], ["keys", "orders", "o-*"], ["incr", "orders", "n"])
    # The commands once while root, on a database of their own: what they import (a
    # command's module when it runs) is imported, as the interpreter's files may not be
    # readable by that user.
    with tempfile.TemporaryDirectory() as scratch, open(os.devnull, "w") as quiet:
        for command in (["set", "orders", "o-1", "1"], *commands):
            sys.argv = ["reactor", "--db", os.path.join(scratch, "warm.db"), *command]
            with contextlib.redirect_stdout(quiet), contextlib.suppress(SystemExit):
                main()
    os.setgid(65534)
    os.setuid(65534)
    for command in commands:
        sys.argv = ["reactor", "--db", db, *command]
        try:
            main()
        except SystemExit as exc:
            print("exit", exc.code, flush=True)
"""


# -- the command line -----------------------------------------------------------------------
@pytest.fixture
def frozen_db(tmp_path: Path) -> Iterator[Path]:
    """A seeded database file that this process may read but not write, in a folder it
    may not write either; checked unchanged afterwards."""
    folder = tmp_path / "data"
    db = folder / "state.db"
    _seed(db)
    before = _fingerprint(folder)
    with unwritable(folder):
        yield db
    assert _fingerprint(folder) == before


@pytest.mark.sqlite_only("file modes")
def test_reading_commands_work_on_a_database_the_user_cannot_write(
    frozen_db: Path, tmp_path: Path
) -> None:
    def read(*args: str) -> str:
        done = run_reactor("--db", str(frozen_db), *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        return done.stdout

    assert read("get", "orders", "o-1") == '{"total":120}\n'
    assert read("keys", "orders", "o-*") == '["o-1","o-2"]\n'
    assert '"count":2' in read("list", "orders")
    assert read("scopes") == '{"orders":5}\n'
    assert 990 < float(read("ttl", "orders", "note")) <= 1000
    assert '"keys":5' in read("stats")
    assert len(read("export").splitlines()) == 5
    watched = read("watch", "--since", "3", "--count", "2").splitlines()
    assert ['"key":"tags"' in watched[0], '"key":"note"' in watched[1]] == [True, True]


@pytest.mark.sqlite_only("file modes")
@pytest.mark.parametrize(
    "args",
    [
        ("set", "orders", "o-1", "1"),
        ("update", "orders", "o-1", '{"op": "remove", "path": "/total"}'),
        ("delete", "orders", "o-1"),
        ("incr", "orders", "count"),
        ("import",),
    ],
    ids=lambda args: args[0],
)
def test_writing_commands_on_it_fail_in_one_line(
    args: tuple[str, ...], frozen_db: Path, tmp_path: Path
) -> None:
    line = '{"scope": "orders", "key": "x", "value": 1, "ttl": null}\n'
    done = run_reactor("--db", str(frozen_db), *args, cwd=tmp_path, stdin=line)
    assert done.returncode == 3  # storage
    assert done.stderr.startswith(f"Error: cannot write the database {frozen_db}")
    assert "readonly=True" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.sqlite_only("file modes")
def test_the_dashboard_serves_a_database_the_user_cannot_write(
    frozen_db: Path, tmp_path: Path
) -> None:
    httpx = pytest.importorskip("httpx")
    support = pytest.importorskip("tests._ui_support")
    process, url, told = support.start_cli(frozen_db, cwd=tmp_path)
    try:
        assert "(read-only;" in told
        assert httpx.get(url + "api/scopes", timeout=10).json()["scopes"] == {"orders": 5}
    finally:
        _, err = support.stop_cli(process)
    assert process.returncode == 0, err
    done = run_reactor("--db", str(frozen_db), "ui", "--write", "--port", "0", cwd=tmp_path)
    assert done.returncode == 3
    assert done.stderr.startswith("Error: cannot write the database")


def test_reading_commands_read_a_database_of_either_backend(db_path: Any, tmp_path: Path) -> None:
    """On PostgreSQL too, reading commands open read-only; a schema with no reactor
    database yet gets one, as before (a read-only open could not read it)."""
    fresh = run_reactor("--db", str(db_path), "keys", "orders", cwd=tmp_path)
    if isinstance(db_path, Path):
        assert fresh.returncode == 3  # no file: a typo is not an empty database
        assert "no database at" in fresh.stderr
    else:
        assert (fresh.returncode, fresh.stdout) == (0, "[]\n"), fresh.stderr
    _seed(db_path)
    done = run_reactor("--db", str(db_path), "get", "orders", "o-2", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, '{"total":7}\n'), done.stderr


def test_on_postgresql_the_server_refuses_a_write_too(
    db_path: Any, request: pytest.FixtureRequest
) -> None:
    """Read-only connections are in read-only transactions: a write that got past the
    store's own refusal would be refused by the server."""
    if backend(request.config) != "postgresql":
        pytest.skip("PostgreSQL's read-only transactions")
    _seed(db_path)
    with reactor.open(db_path, readonly=True) as state:
        store = engine_of(state).store
        with pytest.raises(reactor.ReadOnlyError, match="read-only transaction"):
            store._query("DELETE FROM reactor_kv", ())  # type: ignore[attr-defined]
        assert state.scope("orders").get("count") == 2
