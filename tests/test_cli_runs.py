"""``reactor runs``, ``run``, ``cancel``, ``send`` and ``reactor serve --workflows``:
durable workflows' runs from the command line (SPEC §14), as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import reactor
from tests.conftest import CLI_ENV, run_reactor, wait_for

FLOWS = textwrap.dedent(
    """
    import os
    import reactor

    state = reactor.open(os.environ["REACTOR_DB"])


    @state.workflow("greet")
    def greet(run, name):
        hello = run.step("hello", lambda: f"hello {name}")
        note = run.receive("note")
        return {"said": hello, "note": note}
    """
)


def _ok(db: Any, *args: str, cwd: Path) -> Any:
    done = run_reactor("--db", str(db), *args, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def flows(tmp_path: Path) -> Path:
    (tmp_path / "shop_flows.py").write_text(FLOWS)
    return tmp_path


def test_serve_runs_the_workflows_a_module_registers_and_the_cli_drives_them(
    db_path: Any, flows: Path
) -> None:
    with reactor.open(db_path) as state:
        handle = state.start("greet", "ann", id="g-1")
        serving = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reactor",
                "--db",
                str(db_path),
                "serve",
                "--workflows",
                "shop_flows",
                "--concurrency",
                "2",
            ],
            cwd=flows,
            env=CLI_ENV,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: handle.status() == "suspended", timeout=30)
            listed = _ok(db_path, "runs", cwd=flows)
            assert [(r["id"], r["workflow"], r["status"], r["steps"]) for r in listed] == [
                ("g-1", "greet", "suspended", 2)
            ]
            assert _ok(db_path, "runs", "--status", "succeeded", cwd=flows) == []
            shown = _ok(db_path, "run", "g-1", cwd=flows)
            assert [step["name"] for step in shown["steps"]] == ["hello", "receive:note"]
            sent = _ok(db_path, "send", "g-1", "note", '{"n": 1}', cwd=flows)
            assert sent == {"id": "g-1", "topic": "note", "sent": {"n": 1}}
            assert handle.result(timeout=30) == {"said": "hello ann", "note": {"n": 1}}
            assert _ok(db_path, "cancel", "g-1", cwd=flows) == {"id": "g-1", "cancelled": False}
        finally:
            serving.terminate()
            _, err = serving.communicate(timeout=30)
        assert serving.returncode == 0, err
        assert "workflows greet (2 workers)" in err


def test_unknown_runs_and_modules_are_one_line_errors(db_path: Any, flows: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    for args in (("run", "nope"), ("cancel", "nope"), ("send", "nope", "t", "1")):
        done = run_reactor("--db", str(db_path), *args, cwd=flows)
        assert done.returncode == 1, done.stderr
        assert done.stderr == "Error: no run 'nope'\n"
    for module, why in (
        ("no_such_module", "cannot import no_such_module"),
        ("json", "registered no workflow"),
    ):
        done = run_reactor("--db", str(db_path), "serve", "--workflows", module, cwd=flows)
        assert done.returncode == 1, done.stderr
        assert why in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
