"""``reactor bench``, run as a user would: a smoke run, figures only checked for shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

VERBS = ("set", "get", "update", "increment", "delete")
REQUIRED = ("reactor", "dict+lock", "sqlite3", "diskcache")


@pytest.mark.timeout(200)
def test_quick_bench_writes_figures_for_every_verb(tmp_path: Path) -> None:
    pytest.importorskip("diskcache")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactor",
            "bench",
            "--quick",
            "--json",
            "out.json",
            "--db-dir",
            "dbs",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    assert "reactor bench" in done.stdout
    result = json.loads((tmp_path / "out.json").read_text())
    figures = result["figures"]
    for peer in REQUIRED:
        assert peer in figures, (peer, result["skipped"], result["errors"])
        for mode in ("1t", "4t"):
            for verb in VERBS:
                assert figures[peer][mode][verb]["ops_per_s"] > 0, (peer, mode, verb)
    for verb in VERBS:
        assert figures["reactor"]["1p"][verb]["ops_per_s"] > 0
        assert figures["reactor"]["aio100"][verb]["ops_per_s"] > 0
    assert figures["reactor"]["4t"]["increment"]["count_exact"] is True
    assert result["events"]["in_process"]["delivered"] > 0
    assert result["machine"]["sqlite"]
    assert list((tmp_path / "dbs").iterdir()) == [], "bench leaves no file behind"


@pytest.mark.timeout(300)
def test_quick_bench_runs_reactor_on_postgresql(tmp_path: Path) -> None:
    url = os.environ.get("REACTOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("reactor bench --backend postgresql needs $REACTOR_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactor",
            "bench",
            "--quick",
            "--backend",
            "postgresql",
            "--url",
            url,
            "--json",
            "out.json",
            "--db-dir",
            "dbs",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    assert "reactor backend: PostgreSQL" in " ".join(done.stdout.split())
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["backend"]["name"] == "postgresql"
    figures = result["figures"]
    assert "dict+lock" in figures, (result["skipped"], result["errors"])
    assert "reactor" not in result["errors"], result["errors"]["reactor"]
    for mode in ("1t", "4t", "1p", "4p", "aio100"):
        for verb in VERBS:
            assert figures["reactor"][mode][verb]["ops_per_s"] > 0, (mode, verb)
    assert figures["reactor"]["4p"]["increment"]["count_exact"] is True
    assert result["events"]["cross_process"]["delivered"] > 0
    assert not any("could not drop" in note for note in result["notes"])
    assert list((tmp_path / "dbs").iterdir()) == [], "bench leaves no file behind"
