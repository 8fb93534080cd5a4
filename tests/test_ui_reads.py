"""Every read of the dashboard, and a write, on the backend under test: the SQL behind
them runs on PostgreSQL too (tests/test_ui.py covers the HTTP layer in the SQLite pass)."""

from __future__ import annotations

import json
from typing import Any

import httpx

import reactor
from tests._ui_support import HEADERS, TIMEOUT
from tests.conftest import dashboard_thread


def test_every_read_and_a_write_on_the_backend(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        orders = state.scope("orders")
        orders.set("o-1", {"total": 120})
        orders.update("o-1", [reactor.ops.increment("total", 5)])
        orders.set("o-2", "paid", ttl=600)
        timer = orders.schedule("o-3", {"total": 1}, after=600)
        with state.lock("deploy", ttl=600):
            mail = state.queue("mail", max_attempts=1)
            mail.put({"to": "a@example.com"}, group="acme")
            job = mail.take(timeout=0)
            assert job is not None
            job.nack(error="SMTP 550")
            mail.put({"to": "b@example.com"})
            with (
                dashboard_thread(db_path, write=True) as url,
                httpx.Client(base_url=url, timeout=TIMEOUT) as ui,
            ):

                def get(path: str, **params: str) -> Any:
                    answer = ui.get(path, params=params)
                    assert answer.status_code == 200, (path, answer.text)
                    return answer.json()

                assert get("/api/scopes")["scopes"] == {"orders": 2}
                assert get("/api/keys", scope="orders", pattern="o-*")["keys"] == ["o-1", "o-2"]
                value = get("/api/value", scope="orders", key="o-2")
                assert value["value"] == "paid"
                assert 590 < value["ttl"] <= 600
                history = get("/api/history", scope="orders", key="o-1")["changes"]
                assert [change["type"] for change in history] == ["updated", "created"]
                assert [lock["name"] for lock in get("/api/locks")["locks"]] == ["deploy"]
                assert [row["id"] for row in get("/api/timers")["timers"]] == [timer.id]
                [queue] = get("/api/queues")["queues"]
                assert (queue["name"], queue["ready"], queue["dead"]) == ("mail", 1, 1)
                [dead] = get("/api/dead", queue="mail")["jobs"]
                assert dead["error"] == "SMTP 550"
                found = get("/api/job", queue="mail", id=str(dead["id"]))
                assert (found["state"], found["group"]) == ("dead", "acme")
                assert get("/api/stats")["keys"] == 2
                written = ui.post(
                    "/api/set",
                    content=json.dumps({"scope": "orders", "key": "o-4", "value": 1.0}),
                    headers=HEADERS,
                )
                assert written.json() == {"old_value": None, "new_value": 1.0}
        assert orders.get("o-4") == 1.0
