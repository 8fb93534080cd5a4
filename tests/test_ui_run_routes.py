"""The dashboard's endpoints of durable workflows' runs (``reactor._ui.run_routes``):
the runs listed with their status, one run with its steps and their times, a run
cancelled. Driven over HTTP, as the page does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import reactor
from tests._ui_support import HEADERS, TIMEOUT
from tests.conftest import dashboard_thread, wait_for


@pytest.fixture
def runs(db_path: Any) -> Iterator[reactor.State]:
    """Runs of "order": one succeeded, one failed at its second step, one suspended
    waiting for a message; the handle stays open for the test."""
    with reactor.open(db_path) as state:

        @state.workflow("order")
        def order(run: reactor.Run, spec: dict[str, Any]) -> Any:
            run.step("reserve", lambda: {"item": spec["item"]})
            if spec.get("fail"):
                run.step("charge", _decline)
            if spec.get("wait"):
                run.receive("approval")
            return "done"

        handles = [
            state.start("order", {"item": "a"}, id="ok"),
            state.start("order", {"item": "b", "fail": True}, id="bad"),
            state.start("order", {"item": "c", "wait": True}, id="waiting"),
        ]
        with state.serve():
            wait_for(
                lambda: [h.status() for h in handles] == ["succeeded", "failed", "suspended"], 10
            )
        yield state


def _decline() -> None:
    raise ValueError("card declined")


def test_the_runs_are_listed_newest_first_with_the_failed_counted(
    runs: reactor.State, db_path: Any
) -> None:
    with dashboard_thread(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        answer = ui.get("/api/runs")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["count"], body["failed"]) == (3, 1)
        by_id = {run["id"]: run for run in body["runs"]}
        assert {run_id: run["status"] for run_id, run in by_id.items()} == {
            "ok": "succeeded",
            "bad": "failed",
            "waiting": "suspended",
        }
        assert by_id["bad"]["error"]["type"] == "StepFailedError"
        assert json.loads(by_id["ok"]["result"]) == "done"
        assert by_id["waiting"]["steps"] == 2
        updated = [run["updated"] for run in body["runs"]]
        assert updated == sorted(updated, reverse=True)
        failed = ui.get("/api/runs", params={"status": "failed", "workflow": "ord*"}).json()
        assert [run["id"] for run in failed["runs"]] == ["bad"]
        assert ui.get("/api/runs", params={"status": "lost"}).status_code == 400


def test_a_run_is_shown_with_its_steps_and_their_times(runs: reactor.State, db_path: Any) -> None:
    with dashboard_thread(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        run = ui.get("/api/run", params={"id": "bad"}).json()
        assert [(s["name"], s["status"]) for s in run["steps"]] == [
            ("reserve", "succeeded"),
            ("charge", "failed"),
        ]
        assert run["steps"][1]["error"] == {"type": "ValueError", "message": "card declined"}
        assert all(s["started"] <= s["ended"] for s in run["steps"])
        waiting = ui.get("/api/run", params={"id": "waiting"}).json()
        assert waiting["steps"][-1]["status"] == "waiting"
        assert waiting["steps"][-1]["ended"] is None
        missing = ui.get("/api/run", params={"id": "nobody"})
        assert missing.status_code == 404
        assert missing.json()["error"] == "NotFound"


def test_a_run_is_cancelled_only_when_the_dashboard_may_write(
    runs: reactor.State, db_path: Any
) -> None:
    with dashboard_thread(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        refused = ui.post("/api/cancel_run", json={"id": "waiting"}, headers=HEADERS)
        assert refused.status_code == 403
    assert runs.run("waiting").status() == "suspended"
    with (
        dashboard_thread(db_path, write=True) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT) as ui,
    ):
        done = ui.post("/api/cancel_run", json={"id": "waiting"}, headers=HEADERS)
        assert done.json() == {"cancelled": True}
        again = ui.post("/api/cancel_run", json={"id": "waiting"}, headers=HEADERS)
        assert again.json() == {"cancelled": False}
        assert ui.post("/api/cancel_run", json={"id": "nobody"}, headers=HEADERS).status_code == 404
    assert runs.run("waiting").status() == "cancelled"
