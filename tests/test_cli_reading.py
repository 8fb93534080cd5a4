"""The quick reads (``reactor get``, ``ttl``...) on a SQLite file's store alone, without
an engine (``reactor.cli.reading``): what another process does meanwhile, and what the
upkeep has not swept yet, reads as through ``reactor.open``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import reactor

from .conftest import CLI_ENV, run_reactor

WRITER = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        counter = state.scope("s")
        print("ready", flush=True)
        for _ in range(int(sys.argv[2])):
            counter.increment("n")
"""


@pytest.mark.sqlite_only("the quick reads open a SQLite file's store alone")
def test_quick_reads_during_another_process_writes(db_path: Any, tmp_path: Path) -> None:
    """Each ``reactor get`` of a counter another process is incrementing answers (no
    busy error, no torn read), never goes back, and ends on the last value."""
    with reactor.open(db_path) as state:
        state.scope("s").set("n", 0)
    writes = 3000
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(db_path), str(writes)],
        stdout=subprocess.PIPE,
        text=True,
        env=CLI_ENV,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        seen = []
        while writer.poll() is None and len(seen) < 40:
            done = run_reactor("--db", str(db_path), "get", "s", "n", cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            seen.append(json.loads(done.stdout))
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=10)
        if writer.stdout is not None:
            writer.stdout.close()
    assert seen, "the writer ended before the first read"
    assert seen == sorted(seen)
    assert all(isinstance(value, int) and 0 <= value <= writes for value in seen)
    last = run_reactor("--db", str(db_path), "get", "s", "n", cwd=tmp_path)
    assert json.loads(last.stdout) == writes


@pytest.mark.sqlite_only("the quick reads open a SQLite file's store alone")
def test_quick_reads_hide_a_key_past_its_deadline_before_the_sweep(
    db_path: Any, tmp_path: Path
) -> None:
    """A key whose deadline passed is gone for ``get``, ``exists``, ``ttl``, ``keys``,
    ``mget`` and ``scopes`` at once, though no upkeep has removed its row yet."""
    with reactor.open(db_path, sweep_interval=1_000_000) as state:
        state.scope("s").set("short", 1, ttl=0.2)
        state.scope("s").set("long", 2)
        time.sleep(0.3)  # the deadline passes; the sweep (every 11 days) never runs
        assert state.scope("s").ttl("short") == -2  # as the library sees it
        db = str(db_path)
        got = run_reactor("--db", db, "get", "s", "short", cwd=tmp_path)
        assert got.returncode == 1
        answers = [
            run_reactor("--db", db, *args, cwd=tmp_path).stdout.strip()
            for args in (
                ("exists", "s", "short"),
                ("ttl", "s", "short"),
                ("keys", "s"),
                ("mget", "s", "short", "long"),
                ("scopes",),
            )
        ]
    assert answers == ["0", "-2", '["long"]', "[null,2]", '{"s":1}']
