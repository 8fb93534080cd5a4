"""``reactor demo``, run twice in a fresh folder as a newcomer would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import reactor


def _demo(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor", "demo"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
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
