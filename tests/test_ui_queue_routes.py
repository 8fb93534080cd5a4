"""The dashboard's job endpoints (``reactor._ui.queue_routes``): a job looked up by id,
cancelled, a queue's jobs purged by state. Driven over HTTP, as the page does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import reactor
from tests._ui_support import HEADERS, TIMEOUT
from tests.conftest import dashboard_thread


@pytest.fixture
def jobs(db_path: Any) -> Iterator[reactor.State]:
    """A queue "mail" with a job dead after two failed attempts (one with an exception),
    one taken, one ready; the handle stays open for the test."""
    with reactor.open(db_path) as state:
        mail = state.queue("mail", max_attempts=2)
        mail.put({"to": "a@example.com"}, key="welcome-a", priority=3, group="acme")
        mail.put({"to": "b@example.com"})
        mail.put({"to": "c@example.com"})
        first = mail.take(timeout=0)
        assert first is not None
        first.nack(error="SMTP 451: try later")
        again = mail.take(timeout=0)
        assert again is not None
        assert again.id == first.id
        try:
            _send()
        except ConnectionError as exc:
            again.nack(error=exc)
        assert mail.take(timeout=0, lease=600) is not None
        yield state


def _send() -> None:
    raise ConnectionError("mail server closed the connection")


def _client(db_path: Any, *, write: bool = False) -> Any:
    return dashboard_thread(db_path, write=write)


def test_a_job_is_looked_up_by_id_with_each_attempts_error(
    jobs: reactor.State, db_path: Any
) -> None:
    with _client(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        answer = ui.get("/api/job", params={"queue": "mail", "id": "1"})
        assert answer.status_code == 200, answer.text
        job = answer.json()
        assert job["state"] == "dead"
        assert json.loads(job["item"]) == {"to": "a@example.com"}
        assert (job["attempts"], job["max_attempts"]) == (2, 2)
        assert (job["priority"], job["group"], job["key"]) == (3, "acme", "welcome-a")
        assert [error["attempt"] for error in job["errors"]] == [1, 2]
        assert job["errors"][0]["error"] == "SMTP 451: try later"
        assert "ConnectionError: mail server closed the connection" in job["errors"][1]["error"]
        assert job["errors"][1]["error"].startswith("Traceback")
        assert set(job["errors"][0]["worker"]) == {"host", "pid", "thread", "thread_id"}
        taken = ui.get("/api/job", params={"queue": "mail", "id": "2"}).json()
        assert taken["state"] == "taken"
        assert taken["worker"] is not None
        ready = ui.get("/api/job", params={"queue": "mail", "id": "3"}).json()
        assert (ready["state"], ready["attempts"], ready["errors"]) == ("ready", 0, [])
        assert ready == {**ready, "group": None, "key": None, "worker": None}
        missing = ui.get("/api/job", params={"queue": "mail", "id": "99"})
        assert missing.status_code == 404
        assert missing.json()["error"] == "NotFound"
        assert ui.get("/api/job", params={"queue": "none", "id": "1"}).status_code == 404
        for bad in ("x", "-1", "1.5", "9" * 30, ""):
            refused = ui.get("/api/job", params={"queue": "mail", "id": bad})
            assert refused.status_code == 400, bad
        assert ui.get("/api/job", params={"queue": "mail"}).status_code == 400
        assert ui.get("/api/job", params={"queue": "", "id": "1"}).status_code == 400


def test_cancel_and_purge_with_write(jobs: reactor.State, db_path: Any) -> None:
    mail = jobs.queue("mail")
    with (
        _client(db_path, write=True) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT) as ui,
    ):

        def post(path: str, body: Any) -> httpx.Response:
            return ui.post(path, content=json.dumps(body), headers=HEADERS)

        answer = post("/api/cancel_job", {"queue": "mail", "id": 3})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"cancelled": True}
        assert mail.job(3) is None
        again = post("/api/cancel_job", {"queue": "mail", "id": 3})
        assert again.status_code == 404
        for bad in ("3", 1.5, None, True):
            assert post("/api/cancel_job", {"queue": "mail", "id": bad}).status_code == 400, bad
        assert post("/api/purge", {"queue": "mail", "state": "nope"}).status_code == 400
        assert post("/api/purge", {"queue": "none", "state": "dead"}).status_code == 404
        purged = post("/api/purge", {"queue": "mail", "state": "dead"})
        assert purged.json() == {"purged": 1}
        assert mail.stats()["dead"] == 0
        assert mail.stats()["taken"] == 1  # the others stay
        assert post("/api/purge", {"queue": "mail", "state": None}).json() == {"purged": 1}
        assert mail.stats()["taken"] == 0


def test_cancel_and_purge_are_refused_read_only(jobs: reactor.State, db_path: Any) -> None:
    mail = jobs.queue("mail")
    before = mail.stats()
    with _client(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        for path, body in (
            ("/api/cancel_job", {"queue": "mail", "id": 3}),
            ("/api/purge", {"queue": "mail", "state": None}),
        ):
            answer = ui.post(path, json=body, headers=HEADERS)
            assert answer.status_code == 403
    assert mail.stats() == before
    assert mail.job(3) is not None


def test_a_queues_jobs_by_state(jobs: reactor.State, db_path: Any) -> None:
    with _client(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
        listed = {}
        for state in ("ready", "taken", "dead"):
            answer = ui.get("/api/jobs", params={"queue": "mail", "state": state})
            assert answer.status_code == 200, answer.text
            listed[state] = answer.json()
        assert [job["id"] for job in listed["dead"]["jobs"]] == [1]
        assert listed["dead"]["dead"] == 1
        assert "ConnectionError" in listed["dead"]["jobs"][0]["error"]
        assert [job["id"] for job in listed["taken"]["jobs"]] == [2]
        assert listed["taken"]["jobs"][0]["ready_at"] > jobs.queue("mail").job(2).created_at
        assert [json.loads(job["item"]) for job in listed["ready"]["jobs"]] == [
            {"to": "c@example.com"}
        ]
        assert listed["ready"]["ready"] == 1
        refused = ui.get("/api/jobs", params={"queue": "mail", "state": "done"})
        assert refused.status_code == 400
        missing = ui.get("/api/jobs", params={"queue": "nope", "state": "ready"})
        assert missing.status_code == 404
