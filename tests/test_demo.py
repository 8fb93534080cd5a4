"""``reactor demo``, run twice in a fresh folder as a newcomer would."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import reactor


def _demo(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor", *(args or ("demo",))],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
    )


def _stored_position(db: Path) -> int:
    with reactor.open(db) as state:
        return int(state.stats()["durable_subscribers"]["ledger"]["position"])


def test_the_demo_runs_a_workflow_and_its_state_survives(tmp_path: Path) -> None:
    db = tmp_path / "reactor-demo.db"
    first = _demo(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "First run" in first.stdout
    assert "Traceback" not in first.stderr
    # Live: each order's steps, as they commit.
    for status in ("new → paid", "paid → packed", "packed → shipped"):
        assert status in first.stdout
    assert "expired" in first.stdout  # the cached rate expired while the demo watched
    position = _stored_position(db)

    second = _demo(tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Run #2" in second.stdout
    resumed = re.search(r"resumes\s+after\s+revision\s+(\d+)", second.stdout)
    assert resumed is not None, second.stdout
    assert int(resumed.group(1)) == position  # where the durable ledger had stopped

    with reactor.open(db) as state:
        orders = state.scope("orders")
        shipped = orders.get_many(orders.keys("o-*"))
        assert sorted(shipped) == [f"o-{run}-{n}" for run in (1, 2) for n in (1, 2, 3)]
        assert {order["status"] for order in shipped.values()} == {"shipped"}
        assert all(len(order["history"]) == 3 for order in shipped.values())
        ledger = state.scope("ledger")
        assert ledger.get("orders_paid") == 6
        assert round(ledger.get("revenue"), 2) == round(
            sum(order["total"] for order in shipped.values()), 2
        )
        assert state.scope("counters").get("orders_created") == 6
        assert state.scope("cache").keys() == []
        stats = state.stats()["durable_subscribers"]["ledger"]
        assert stats["position"] > position
        assert stats["failed"] == 0


def test_the_demo_runs_on_the_database_given_to_reactor(tmp_path: Path) -> None:
    """``reactor --db PATH demo`` runs the demo there (and says how to run it again);
    ``$REACTOR_DB`` does not count: it names the user's own database."""
    done = _demo(tmp_path, "--db", "mine.db", "demo", env={"REACTOR_DB": "users.db"})
    assert done.returncode == 0, done.stderr
    assert "First run" in done.stdout
    assert "reactor --db mine.db demo" in " ".join(done.stdout.split())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine.db"]
    with reactor.open(tmp_path / "mine.db") as state:
        assert state.scope("demo").get("runs") == 1


@pytest.mark.parametrize(
    ("args", "environment", "opened"),
    [
        (["demo"], {}, "reactor-demo.db"),
        (["demo"], {"REACTOR_DB": "users.db"}, "reactor-demo.db"),
        (["--db", "given.db", "demo"], {}, "given.db"),
        (["--db", "postgresql+psycopg://u@h/db", "demo"], {}, "postgresql+psycopg://u@h/db"),
        (["--db", "postgresql://u:secret@h/db", "demo"], {}, "postgresql://u:secret@h/db"),
        (["demo", "--db", "own.db"], {"REACTOR_DB": "users.db"}, "own.db"),
        (["--db", "given.db", "demo", "--db", "own.db"], {}, "own.db"),
    ],
)
def test_which_database_the_demo_opens(
    args: list[str], environment: dict[str, str], opened: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reactor import cli
    from reactor.cli import demo as _demo
    from reactor.cli import programs

    found: list[Any] = []

    @contextmanager
    def fake_open(target: Any) -> Any:
        found.append(target)
        yield None

    monkeypatch.setattr(programs, "open_state", fake_open)
    monkeypatch.setattr(_demo, "run_demo", lambda *_, **options: found.append(options["again"]))
    monkeypatch.delenv("REACTOR_DB", raising=False)
    done = CliRunner().invoke(cli.cli, args, env=environment)
    assert done.exit_code == 0, done.output
    shown = shlex.quote(opened.replace(":secret@", ":***@"))  # never the password
    again = "reactor demo" if opened == "reactor-demo.db" else f"reactor --db {shown} demo"
    assert found == [opened, again]
