"""Start-up: what ``import reactor`` and a quick ``reactor`` command do not load.

A command is often one call in a shell loop, so modules that only some uses need
(SQLAlchemy to create or migrate a schema, reactor.aio and asyncio's machinery, rich for
tables, the PostgreSQL driver, the dashboard) are imported when used. These tests look at
``sys.modules`` in a fresh interpreter; they never time anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import reactor
from tests.conftest import CLI_ENV

# Never needed to open a current SQLite file and run a verb on it.
HEAVY = (
    "sqlalchemy",
    "reactor.aio",
    "reactor.aio.exclusive",
    "reactor._version",
    "rich",
    "psycopg",
    "starlette",
    "uvicorn",
    "reactor._ui",
    "reactor._bench",
    "reactor.cli.demo",
)


def _loaded(code: str, *, cwd: Path) -> list[str]:
    """Run ``code`` in a fresh interpreter; the modules of ``HEAVY`` it had loaded by
    the end (of the command, when ``code`` runs one)."""
    script = (
        "import json, sys\ntry:\n"
        + textwrap.indent(textwrap.dedent(code).strip(), "    ")
        + "\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        + f"print(json.dumps(sorted(set({HEAVY!r}) & set(sys.modules))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def _command(*args: str) -> str:
    return f"sys.argv = ['reactor', *{list(args)!r}]\nfrom reactor.cli import main\nmain()"


@pytest.fixture
def current_db(tmp_path: Path) -> Path:
    """A SQLite file with the current schema and a few keys."""
    path = tmp_path / "state.db"
    with reactor.open(path) as state:
        state.scope("s").set("k", {"a": 1})
        state.scope("s").set("t", 1, ttl=1000)
        state.scope("s").increment("n")
    return path


def test_import_reactor_loads_nothing_heavy(tmp_path: Path) -> None:
    assert _loaded("import reactor", cwd=tmp_path) == []


def test_import_reactor_loads_its_names_on_first_use(tmp_path: Path) -> None:
    """``import reactor`` loads reactor.errors alone; the first public name asked for
    loads the engine and the handles, with their libraries."""
    program = textwrap.dedent(
        """
        import json, sys
        import reactor
        first = sorted(m for m in sys.modules if m.startswith(("reactor", "pykka", "blinker")))
        state = reactor.open(":memory:")
        state.close()
        then = {"reactor._handles.state", "pykka", "blinker"} <= set(sys.modules)
        print(json.dumps([first, then, reactor.Scope.__module__]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["reactor", "reactor.errors"], True, "reactor"]


@pytest.mark.sqlite_only("what opening a SQLite file loads")
@pytest.mark.parametrize(
    "args",
    [
        ("get", "s", "k"),
        ("set", "s", "k", "2"),
        ("keys", "s"),
        ("incr", "s", "n"),
        ("ttl", "s", "t"),
        ("list", "s"),
        ("delete", "s", "k"),
    ],
    ids=lambda args: args[0],
)
def test_a_command_on_a_current_database_loads_nothing_heavy(
    args: tuple[str, ...], current_db: Path
) -> None:
    # stdout is a pipe: JSON, so not even rich.
    assert _loaded(_command("--db", str(current_db), *args), cwd=current_db.parent) == []


ENGINE = ("pykka", "blinker", "reactor._engine.engine", "reactor._handles.state", "asyncio")


@pytest.mark.sqlite_only("the quick reads open a SQLite file's store alone")
@pytest.mark.parametrize(
    "args",
    [
        ("get", "s", "k"),
        ("mget", "s", "k", "n"),
        ("exists", "s", "k"),
        ("ttl", "s", "t"),
        ("keys", "s"),
        ("list", "s"),
        ("scopes",),
    ],
    ids=lambda args: args[0],
)
def test_a_quick_read_starts_no_engine(args: tuple[str, ...], current_db: Path) -> None:
    """The commands a shell loop calls read the file's store alone: no actors, no
    listener hub, no asyncio, and only the modules of the command asked for."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.argv = ["reactor", "--db", {str(current_db)!r}, *{list(args)!r}]
        from reactor.cli import main
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        print(json.dumps([m for m in {ENGINE!r} if m in sys.modules]))
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("reactor.cli."))))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=current_db.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV,
    )
    assert done.returncode == 0, done.stderr
    engine, commands = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert engine == []
    assert "reactor.cli.values" in commands
    assert not {"reactor.cli.queues", "reactor.cli.serve", "reactor.cli.programs"} & set(commands)


def test_help_loads_nothing_heavy(tmp_path: Path) -> None:
    assert _loaded(_command("--help"), cwd=tmp_path) == []
    assert _loaded(_command("get", "--help"), cwd=tmp_path) == []


@pytest.mark.sqlite_only("what creating a SQLite file loads")
def test_creating_a_database_does_load_sqlalchemy(tmp_path: Path) -> None:
    """The schema is created with SQLAlchemy: the check above would see it loaded."""
    db = str(tmp_path / "new.db")
    assert _loaded(_command("--db", db, "set", "s", "k", "1"), cwd=tmp_path) == ["sqlalchemy"]
    assert _loaded(_command("--db", db, "get", "s", "k"), cwd=tmp_path) == []


def test_a_table_loads_rich(current_db: Path) -> None:
    args = ("--db", str(current_db), "get", "s", "k", "--table")
    assert _loaded(_command(*args), cwd=current_db.parent) == ["rich"]


def test_reactor_aio_works_after_a_plain_import(tmp_path: Path) -> None:
    code = f"""
        import reactor
        assert "reactor.aio" not in sys.modules
        assert reactor.aio.open is not None  # the first use imports it
        assert reactor.aio is sys.modules["reactor.aio"]
        from reactor import aio
        assert aio is reactor.aio
        import asyncio
        async def main():
            async with reactor.aio.open({str(tmp_path / "a.db")!r}) as state:
                await state.scope("s").set("k", 1)
                return await state.scope("s").get("k")
        assert asyncio.run(main()) == 1
    """
    assert "reactor.aio" in _loaded(code, cwd=tmp_path)


def test_an_early_reference_to_reactor_aio_works(tmp_path: Path) -> None:
    code = """
        from reactor import aio
        assert "reactor.aio" not in sys.modules
        assert "AsyncState" in dir(aio)
        assert aio.AsyncState is sys.modules["reactor.aio"].AsyncState
    """
    assert "reactor.aio" in _loaded(code, cwd=tmp_path)


def test_version_is_there_when_asked() -> None:
    from importlib.metadata import version

    assert reactor.__version__ == version("reactor-state")
    assert "__version__" in dir(reactor)
    with pytest.raises(AttributeError):
        reactor.no_such_name  # noqa: B018 - the attribute access is the test


def test_the_demo_database_default_is_the_demos() -> None:
    from reactor.cli import demo as _demo
    from reactor.cli import programs

    assert programs._DEMO_DATABASE == _demo.DEMO_DATABASE
