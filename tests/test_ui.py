"""``reactor ui``, the dashboard: its JSON API on the test's database (SQLite, or
PostgreSQL with ``--backend=postgresql``), its change feed under a real uvicorn, and the
command as a process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import reactor
from tests._ui_support import (
    HEADERS,
    TIMEOUT,
    feed,
    start_cli,
    stop_cli,
    take,
    write_elsewhere,
)
from tests.conftest import CLI_ENV, dashboard_thread, run_reactor

pytestmark = [
    pytest.mark.timeout(90),
    # The dashboard over verbs and reads tested on both backends; tests/test_ui_reads.py
    # runs each of its reads on PostgreSQL.
    pytest.mark.sqlite_only("the dashboard's HTTP layer: test_ui_reads runs its reads on both"),
]

# The limits docs/guides/dashboard.md gives: timers and queues listed, characters of a
# timer's write and of a dead letter's item sent, the size of two values diffed.
TIMERS_MAX = 200
QUEUES_MAX = 200
TIMER_TEXT_MAX = 200
JOB_TEXT_MAX = 2000
MAX_DIFF_CHARS = 256 * 1024
# Seconds the server gives open connections to end once told to stop (GRACE in
# reactor/_ui/server.py): a stop takes no longer.
GRACE = 3

Client = Callable[..., httpx.Client]


@pytest.fixture
def client(db_path: Any) -> Iterator[Client]:
    """Start the dashboard on the test's database (under uvicorn, in a thread), and a
    client for it: ``client(write=True)``. All stopped afterwards."""
    with ExitStack() as stack:

        def start(*, write: bool = False, hosts: list[str] | None = None) -> httpx.Client:
            url = stack.enter_context(dashboard_thread(db_path, write=write, hosts=hosts))
            return stack.enter_context(httpx.Client(base_url=url, timeout=TIMEOUT))

        yield start


@pytest.fixture
def seeded(db_path: Any) -> Any:
    """The test's database with a few orders, a counter and a cache entry."""
    with reactor.open(db_path) as state:
        orders = state.scope("orders")
        orders.set("o-1", {"total": 120, "status": "new"})
        orders.set("o-2", {"total": 80, "status": "paid"})
        orders.increment("count", 2)
        state.scope("cache").set("rate", 1.0, ttl=600)
    return db_path


def _everything(db: Any) -> dict[str, Any]:
    """Every scope's values, and the revision: what a refused write must not change."""
    with reactor.open(db) as state:
        values = {name: state.scope(name).list() for name in state.scopes()}
        return {"values": values, "revision": state.stats()["revision"]}


# -- the page ---------------------------------------------------------------------
def test_the_page_and_its_files_are_served_from_the_package(client: Client) -> None:
    ui = client()
    page = ui.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert '<script src="static/app.js"' in page.text
    for name, kind in [
        ("app.js", "javascript"),
        ("runs.js", "javascript"),
        ("charts.js", "javascript"),
        ("style.css", "text/css"),
        ("vendor/uplot/uPlot.iife.min.js", "javascript"),  # the charts' library, MIT
        ("vendor/uplot/uPlot.min.css", "text/css"),
        ("vendor/uplot/LICENSE", ""),
    ]:
        served = ui.get(f"/static/{name}")
        assert served.status_code == 200, name
        assert kind in served.headers["content-type"]
        # Offline: nothing is fetched from another host (no CDN, no web font); uPlot
        # names its home in its first comment only.
        text = served.text.removeprefix("/*! https://github.com/leeoniya/uPlot")
        assert "http://" not in text
        assert "https://" not in text
    assert '<script src="static/vendor/uplot/uPlot.iife.min.js"' in page.text
    assert "http://" not in page.text
    assert "https://" not in page.text
    assert ui.get("/static/nothing.js").status_code == 404


def test_info_says_the_database_and_the_mode(client: Client, seeded: Any) -> None:
    info = client().get("/api/info").json()
    assert info["write"] is False
    assert info["version"] == reactor.__version__
    with reactor.open(seeded) as state:
        assert info["database"] == state.location
    assert client(write=True).get("/api/info").json()["write"] is True


# -- reads ------------------------------------------------------------------------
def test_scopes_with_their_key_counts(client: Client, seeded: Any) -> None:
    answer = client().get("/api/scopes")
    assert answer.status_code == 200
    assert answer.json() == {"scopes": {"cache": 1, "orders": 3}}
    assert list(answer.json()["scopes"]) == ["cache", "orders"]


def test_keys_filtered_by_a_glob_with_sql_metacharacters_literal(
    client: Client, db_path: Any
) -> None:
    names = ["o-1", "o-2", "o_1", "o%1", "o*1", "order", "x-1"]
    with reactor.open(db_path) as state:
        state.scope("s").set_many(dict.fromkeys(names, 0))
    ui = client()

    def keys(pattern: str) -> list[str]:
        answer = ui.get("/api/keys", params={"scope": "s", "pattern": pattern})
        assert answer.status_code == 200, answer.text
        assert answer.json()["pattern"] == pattern
        found: list[str] = answer.json()["keys"]
        return found

    assert keys("*") == sorted(names)
    assert keys("o-*") == ["o-1", "o-2"]
    assert keys("o_*") == ["o_1"]  # _ is not SQL's any-character
    assert keys("o%*") == ["o%1"]  # nor % SQL's any-string
    assert keys("o\\*1") == ["o*1"]  # \ escapes a glob character
    assert keys("o?1") == ["o%1", "o*1", "o-1", "o_1"]
    assert keys("[ox]-1") == ["o-1", "x-1"]
    assert keys("nothing*") == []
    default = ui.get("/api/keys", params={"scope": "s"}).json()
    assert default["keys"] == sorted(names)


def test_keys_of_an_empty_scope_and_bad_requests(client: Client, seeded: Any) -> None:
    ui = client()
    assert ui.get("/api/keys", params={"scope": "none"}).json()["keys"] == []
    missing = ui.get("/api/keys")
    assert missing.status_code == 400
    assert missing.json()["error"] == "InvalidRequest"
    assert "'scope'" in missing.json()["message"]
    empty = ui.get("/api/keys", params={"scope": ""})
    assert empty.status_code == 400
    assert empty.json()["error"] == "InvalidKeyError"


def test_a_value_with_its_ttl_and_versions(client: Client, seeded: Any) -> None:
    ui = client()
    order = ui.get("/api/value", params={"scope": "orders", "key": "o-1"})
    assert order.status_code == 200
    assert order.json() == {
        "scope": "orders",
        "key": "o-1",
        "value": {"total": 120, "status": "new"},
        "text": '{\n  "total": 120,\n  "status": "new"\n}',
        "ttl": None,
        "version": 1,
        "revision": 1,
        "created_revision": 1,
    }
    with reactor.open(seeded) as state:
        state.scope("orders").update("o-1", [{"type": "increment", "path": "total"}])  # 5
        state.scope("orders").set("o-1", {"total": 0})  # 6
    changed = ui.get("/api/value", params={"scope": "orders", "key": "o-1"}).json()
    assert (changed["version"], changed["revision"], changed["created_revision"]) == (3, 6, 1)
    rate = ui.get("/api/value", params={"scope": "cache", "key": "rate"}).json()
    assert rate["text"] == "1.0"  # a float stays a float, for the page too
    assert isinstance(rate["value"], float)
    assert 590 < rate["ttl"] <= 600


def test_a_missing_key_is_404(client: Client, seeded: Any) -> None:
    answer = client().get("/api/value", params={"scope": "orders", "key": "o-9"})
    assert answer.status_code == 404
    assert answer.json() == {"error": "NotFound", "message": "no key 'o-9' in scope 'orders'"}


def test_stats(client: Client, seeded: Any) -> None:
    stats = client().get("/api/stats").json()
    assert stats["scopes"] == {"cache": 1, "orders": 3}
    assert stats["keys"] == 4
    assert stats["revision"] == 4
    assert stats["database_bytes"] > 0


# -- writes -----------------------------------------------------------------------
WRITES = [
    ("/api/set", {"scope": "orders", "key": "o-3", "value": 1}),
    ("/api/update", {"scope": "orders", "key": "o-1", "ops": [{"type": "remove", "path": ""}]}),
    ("/api/delete", {"scope": "orders", "key": "o-1"}),
    ("/api/cancel_timer", {"id": "0" * 32}),
    ("/api/retry_dead", {"queue": "emails"}),
    ("/api/cancel_job", {"queue": "emails", "id": 1}),
    ("/api/purge", {"queue": "emails", "state": None}),
]


@pytest.mark.parametrize(("path", "body"), WRITES)
def test_writes_are_refused_without_write(
    client: Client, seeded: Any, path: str, body: dict[str, Any]
) -> None:
    before = _everything(seeded)
    answer = client().post(path, json=body, headers=HEADERS)
    assert answer.status_code == 403
    assert answer.json()["error"] == "Forbidden"
    assert "read-only" in answer.json()["message"]
    assert "--write" in answer.json()["message"]
    assert _everything(seeded) == before


def test_set_update_and_delete_with_write(client: Client, seeded: Any) -> None:
    ui = client(write=True)

    def post(path: str, body: dict[str, Any]) -> Any:
        answer = ui.post(path, content=json.dumps(body), headers=HEADERS)
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert post("/api/set", {"scope": "orders", "key": "o-3", "value": {"total": 1.0}}) == {
        "old_value": None,
        "new_value": {"total": 1.0},
    }
    post("/api/set", {"scope": "cache", "key": "eur", "value": 1.08, "ttl": 60})
    post("/api/set", {"scope": "cache", "key": "rate", "value": 2.0, "keep_ttl": True})
    ops = [
        {"type": "increment", "path": "total", "by": 5},
        {"type": "set", "path": "n", "value": 1},
    ]
    assert post("/api/update", {"scope": "orders", "key": "o-1", "ops": ops}) == {
        "old_value": {"total": 120, "status": "new"},
        "new_value": {"total": 125, "status": "new", "n": 1},
        "errors": [],
        "applied": "all",
    }
    patch = [{"op": "replace", "path": "/status", "value": "paid"}]
    assert post("/api/update", {"scope": "orders", "key": "o-2", "ops": patch})["errors"] == []
    one_op = {"type": "increment", "path": "total"}
    assert post("/api/update", {"scope": "orders", "key": "o-3", "ops": one_op})["new_value"] == {
        "total": 2.0
    }
    assert post("/api/delete", {"scope": "orders", "key": "count"}) == {
        "deleted": True,
        "old_value": 2,
    }
    assert post("/api/delete", {"scope": "orders", "key": "nope"}) == {
        "deleted": False,
        "old_value": None,
    }
    with reactor.open(seeded) as state:
        orders = state.scope("orders")
        assert orders.list() == {
            "o-1": {"total": 125, "status": "new", "n": 1},
            "o-2": {"total": 80, "status": "paid"},
            "o-3": {"total": 2.0},
        }
        assert isinstance(orders.get("o-3")["total"], float)
        assert 50 < state.scope("cache").ttl("eur") <= 60
        assert state.scope("cache").get("rate") == 2.0
        assert 500 < state.scope("cache").ttl("rate") <= 600  # kept


def test_ops_that_do_not_apply_are_reported(client: Client, seeded: Any) -> None:
    ui = client(write=True)
    before = _everything(seeded)
    ops = [{"type": "set", "path": "status", "value": "x"}, {"type": "increment", "path": "status"}]
    body = {"scope": "orders", "key": "o-1", "ops": ops, "atomic": True}
    answer = ui.post("/api/update", content=json.dumps(body), headers=HEADERS)
    assert answer.status_code == 200
    result = answer.json()
    assert [error["code"] for error in result["errors"]] == ["type_mismatch"]
    assert result["new_value"] == result["old_value"]
    assert result["applied"] == "none"  # the page shows it as a failure
    assert _everything(seeded) == before  # atomic: none applied


@pytest.mark.parametrize(
    ("ops", "atomic", "applied"),
    [
        ([{"type": "increment", "path": "total"}], None, "all"),
        ([{"type": "increment", "path": "status"}], None, "none"),  # the only op failed
        (
            [{"type": "increment", "path": "total"}, {"type": "increment", "path": "status"}],
            None,
            "some",
        ),
        (
            [{"type": "increment", "path": "total"}, {"type": "increment", "path": "status"}],
            True,
            "none",
        ),
        (
            [{"op": "replace", "path": "/total", "value": 1}, {"op": "remove", "path": "/x"}],
            None,
            "none",
        ),
    ],
)
def test_an_update_says_whether_it_applied_all_some_or_none(
    client: Client, seeded: Any, ops: list[dict[str, Any]], atomic: bool | None, applied: str
) -> None:
    ui = client(write=True)
    body = {"scope": "orders", "key": "o-1", "ops": ops, "atomic": atomic}
    answer = ui.post("/api/update", content=json.dumps(body), headers=HEADERS)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["applied"] == applied
    assert (result["errors"] == []) == (applied == "all")
    with reactor.open(seeded) as state:
        total = state.scope("orders").get("o-1")["total"]
    assert total == (120 if applied == "none" else 121)


MIXED_STYLES = [{"op": "remove", "path": "/total"}, {"type": "remove", "path": "status"}]
BAD_INPUT = [
    ("/api/set", {"scope": "orders", "key": "", "value": 1}, "InvalidKeyError"),
    ("/api/set", {"scope": "", "key": "k", "value": 1}, "InvalidKeyError"),
    ("/api/set", {"scope": "orders", "key": 7, "value": 1}, "InvalidKeyError"),
    ("/api/set", {"scope": "orders", "key": "k", "value": 2**64}, "InvalidValueError"),
    ("/api/set", {"scope": "orders", "key": "k", "value": 1, "ttl": -1}, "InvalidArgumentError"),
    ("/api/set", {"scope": "orders", "key": "k", "value": 1, "ttl": "1"}, "InvalidArgumentError"),
    ("/api/set", {"scope": "orders", "key": "k"}, "InvalidRequest"),
    ("/api/set", {"scope": "orders", "key": "k", "value": 1, "tll": 5}, "InvalidRequest"),
    ("/api/set", {"scope": "o", "key": "k", "value": 1, "keep_ttl": 1}, "InvalidRequest"),
    ("/api/update", {"scope": "orders", "key": "o-1", "ops": "increment"}, "InvalidOpError"),
    ("/api/update", {"scope": "orders", "key": "o-1", "ops": [1]}, "InvalidOpError"),
    (
        "/api/update",
        {"scope": "orders", "key": "o-1", "ops": MIXED_STYLES},
        "InvalidOpError",
    ),
    ("/api/update", {"scope": "orders", "key": "o-1", "ops": [], "atomic": 1}, "InvalidRequest"),
    ("/api/update", {"scope": "orders", "key": "o-1"}, "InvalidRequest"),
    ("/api/delete", {"scope": "orders", "key": ""}, "InvalidKeyError"),
    ("/api/delete", {"scope": "orders"}, "InvalidRequest"),
    # The scopes of a queue's and a workflow's events: read, never written.
    ("/api/set", {"scope": "queue:emails", "key": "1", "value": 1}, "InvalidKeyError"),
    (
        "/api/update",
        {"scope": "run:fulfil", "key": "k", "ops": [{"type": "remove", "path": ""}]},
        "InvalidKeyError",
    ),
    ("/api/delete", {"scope": "queue:emails", "key": "1"}, "InvalidKeyError"),
]


@pytest.mark.parametrize(("path", "body", "error"), BAD_INPUT)
def test_bad_input_is_400_with_the_error_and_nothing_written(
    client: Client, seeded: Any, path: str, body: dict[str, Any], error: str
) -> None:
    ui = client(write=True)
    before = _everything(seeded)
    answer = ui.post(path, content=json.dumps(body), headers=HEADERS)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == error
    assert answer.json()["message"]
    assert _everything(seeded) == before


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[1]", b'{"scope": "orders", "key": "k", "value": NaN}', b"\xff"],
)
def test_a_body_that_is_not_a_json_object_is_400(client: Client, seeded: Any, raw: bytes) -> None:
    ui = client(write=True)
    before = _everything(seeded)
    answer = ui.post("/api/set", content=raw, headers=HEADERS)
    assert answer.status_code == 400
    assert answer.json()["error"] == "InvalidRequest"
    assert _everything(seeded) == before


# -- cross-site requests and host names -------------------------------------------
@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"Content-Type": "application/json"}, "X-Reactor-UI"),  # no custom header
        ({"X-Reactor-UI": "1", "Content-Type": "text/plain"}, "application/json"),
        ({"X-Reactor-UI": "1", "Content-Type": "application/x-www-form-urlencoded"}, "json"),
        ({"X-Reactor-UI": "1", "Content-Type": "multipart/form-data; boundary=x"}, "json"),
        ({"X-Reactor-UI": "0", "Content-Type": "application/json"}, "X-Reactor-UI"),
        ({**HEADERS, "Origin": "http://evil.example"}, "another origin"),
    ],
)
def test_a_write_needs_json_and_the_dashboards_header(
    client: Client, seeded: Any, headers: dict[str, str], says: str
) -> None:
    ui = client(write=True)
    before = _everything(seeded)
    body = json.dumps({"scope": "orders", "key": "o-9", "value": 1})
    answer = ui.post("/api/set", content=body, headers=headers)
    assert answer.status_code == 403
    assert answer.json()["error"] == "Forbidden"
    assert says in answer.json()["message"]
    assert _everything(seeded) == before
    same_origin = {**HEADERS, "Origin": str(ui.base_url).rstrip("/")}
    assert ui.post("/api/set", content=body, headers=same_origin).status_code == 200


def test_a_form_post_from_another_site_cannot_write(client: Client, seeded: Any) -> None:
    before = _everything(seeded)
    answer = client(write=True).post(
        "/api/set",
        data={"scope": "orders", "key": "o-9", "value": "1"},
        headers={"Origin": "http://evil.example"},
    )
    assert answer.status_code == 403
    assert _everything(seeded) == before


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8765", 200),
        ("localhost:8765", 200),
        ("localhost", 200),
        ("[::1]:8765", 200),
        ("evil.example", 400),  # DNS rebinding: another name pointed at 127.0.0.1
        ("evil.example:8765", 400),
        ("127.0.0.1.evil.example", 400),
    ],
)
def test_only_loopback_host_names_are_served(
    client: Client, seeded: Any, host: str, status: int
) -> None:
    ui = client()
    for path in ("/", "/api/scopes", "/api/value?scope=orders&key=o-1"):
        assert ui.get(path, headers={"Host": host}).status_code == status, (host, path)


def test_the_host_names_allowed(client: Client, seeded: Any) -> None:
    # What `reactor ui --allow-host dash.internal` allows (the guard's own tests, of
    # every kind of address, are in test_internals.py).
    ui = client(hosts=["127.0.0.1", "localhost", "::1", "[::1]", "dash.internal"])
    assert ui.get("/", headers={"Host": "dash.internal"}).status_code == 200
    assert ui.get("/", headers={"Host": "evil.example"}).status_code == 400


def test_a_refused_host_name_is_told_how_to_allow_it(client: Client, seeded: Any) -> None:
    ui = client()
    for host in ("dash.example:8765", "dash.example", "DASH.example"):
        answer = ui.get("/", headers={"Host": host})
        assert answer.status_code == 400, host
        assert answer.text.startswith("Invalid host header")
        assert "reactor ui [--host ADDRESS ...] --allow-host dash.example" in answer.text
        assert answer.headers["content-type"].startswith("text/plain")
    assert "--allow-host 192.168.1.5" in ui.get("/", headers={"Host": "192.168.1.5:80"}).text
    assert "--allow-host [fe80::1]" in ui.get("/", headers={"Host": "[fe80::1]:80"}).text
    # A name not plainly a host name is not repeated back.
    odd = ui.get("/", headers={"Host": "<b>x</b>"})
    assert odd.status_code == 400
    assert "<b>" not in odd.text
    assert "--allow-host NAME" in odd.text
    # The hint does not widen what is allowed: the page is still refused.
    assert ui.get("/api/scopes", headers={"Host": "dash.example"}).status_code == 400


# -- a key's history, the locks held, the subscribers' lag -------------------------------
def test_a_keys_history_newest_first_with_what_changed(client: Client, db_path: Any) -> None:
    with reactor.open(db_path) as state:
        orders = state.scope("orders")
        orders.set("o-1", {"total": 120, "status": "new"})  # 1
        orders.set("o-2", 5)  # 2: another key
        state.scope("other").set("o-1", 7)  # 3: another scope
        orders.update("o-1", [{"type": "set", "path": "total", "value": 1.0}])  # 4
        orders.set("o-1", {"total": 1.0, "status": "paid", "n": 2**60 + 1})  # 5
        orders.delete("o-1")  # 6
        orders.set("o-1", None)  # 7: null is a value
    ui = client()

    def history(**params: str) -> Any:
        answer = ui.get("/api/history", params={"scope": "orders", "key": "o-1", **params})
        assert answer.status_code == 200, answer.text
        return answer.json()

    found = history()
    assert (found["scope"], found["key"], found["compacted"]) == ("orders", "o-1", 0)
    changes = found["changes"]
    assert [(c["revision"], c["type"]) for c in changes] == [
        (7, "created"),
        (6, "deleted"),
        (5, "updated"),
        (4, "updated"),
        (1, "created"),
    ]
    assert (changes[0]["old_text"], changes[0]["new_text"]) == (None, "null")
    assert changes[1]["old_text"] == '{"total":1.0,"status":"paid","n":1152921504606846977}'
    assert changes[1]["new_text"] is None
    assert changes[1]["diff"] is None
    # An update shows its patch, with the values as JSON text (1.0 stays 1.0).
    assert changes[3]["diff"] == {
        "ops": [{"op": "replace", "path": "/total", "old": "120", "value": "1.0"}],
        "more": 0,
    }
    assert changes[3]["ops"] == [{"type": "set", "path": "total", "value": 1.0}]
    assert sorted(changes[2]["diff"]["ops"], key=lambda op: op["path"]) == [
        {"op": "add", "path": "/n", "value": "1152921504606846977"},  # not rounded
        {"op": "replace", "path": "/status", "old": '"new"', "value": '"paid"'},
    ]
    assert changes[4]["timestamp"].endswith("+00:00")
    assert [c["version"] for c in changes] == [1, 0, 3, 2, 1]  # 0: deleted
    assert [c["timer"] for c in changes] == [None] * 5
    assert [c["revision"] for c in history(limit="2")["changes"]] == [7, 6]
    assert history(key="o-9")["changes"] == []
    for params, error in [
        ({"limit": "0"}, "InvalidRequest"),
        ({"limit": "501"}, "InvalidRequest"),
        ({"limit": "x"}, "InvalidRequest"),
        ({"key": ""}, "InvalidKeyError"),
    ]:
        answer = ui.get("/api/history", params={"scope": "orders", "key": "o-1", **params})
        assert answer.status_code == 400, params
        assert answer.json()["error"] == error
    assert ui.get("/api/history", params={"scope": "orders"}).status_code == 400


def test_a_keys_history_says_where_the_log_was_compacted(client: Client, db_path: Any) -> None:
    write_elsewhere(
        db_path,
        """
        from reactor.testing import run_upkeep

        for n in range(6):
            state.scope("s").set("k", n)
        assert run_upkeep(state).log_compacted > 0
        """,
        options="log_retention=2",
    )
    found = client().get("/api/history", params={"scope": "s", "key": "k"}).json()
    assert found["compacted"] >= 1
    assert all(c["revision"] > found["compacted"] for c in found["changes"])
    assert found["changes"][0]["revision"] == 6


def test_the_locks_held(client: Client, db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
        ui = client()
        assert ui.get("/api/locks").json() == {"locks": [], "held": 0}
        deploy = state.lock("deploy", ttl=60)
        deploy.acquire()
        with state.lock("backup", ttl=30):
            answer = ui.get("/api/locks").json()
        assert answer["held"] == 2
        assert [lock["name"] for lock in answer["locks"]] == ["backup", "deploy"]
        backup, held = answer["locks"]
        assert held["token"] == deploy.token == 1
        assert isinstance(held["holder"], str)
        assert held["holder"]
        assert held["holder"] != backup["holder"]
        assert 50 < held["expires_in"] <= 60
        assert 20 < backup["expires_in"] <= 30
        # Released, a lock is no longer listed; taken again, its token is the next one.
        assert [lock["name"] for lock in ui.get("/api/locks").json()["locks"]] == ["deploy"]
        deploy.release()
        assert ui.get("/api/locks").json() == {"locks": [], "held": 0}
        with state.lock("deploy", ttl=60):
            assert ui.get("/api/locks").json()["locks"][0]["token"] == 2


def test_the_durable_subscribers_lag(client: Client, db_path: Any) -> None:
    write_elsewhere(
        db_path,
        """
        import threading

        for n in range(3):
            state.scope("s").set(f"k{n}", n)
        seen, got = threading.Event(), []

        def deliver(event):
            got.append(event.revision)
            if len(got) == 3:
                seen.set()

        subscription = state.subscribe(deliver, durable="mailer", since=0)
        assert seen.wait(30)
        subscription.close()
        for n in range(4):
            state.scope("s").set(f"k{n}", n + 10)
        """,
    )
    stats = client().get("/api/stats").json()
    assert stats["revision"] == 7
    assert stats["durable_subscribers"] == {
        "mailer": {"position": 3, "lag": 4, "delivered": 3, "failed": 0}
    }


# -- timers ----------------------------------------------------------------------------
def test_the_pending_timers_earliest_first_with_what_they_write(
    client: Client, db_path: Any
) -> None:
    ui = client()
    assert ui.get("/api/timers").json() == {"timers": [], "pending": 0}
    with reactor.open(db_path) as state:
        jobs = state.scope("jobs")
        report = jobs.schedule("report", {"state": "due", "rate": 1.0}, after=3600)
        beat = state.scope("health").schedule(
            "beats", ops=[{"type": "increment", "path": ""}], every=600
        )
        late = jobs.schedule(
            "j-1", ops=[{"op": "replace", "path": "/state", "value": "late"}], at=time.time() + 1200
        )
        big = jobs.schedule("big", "é" * 1000, after=7200)
    answer = ui.get("/api/timers")
    assert answer.status_code == 200
    assert answer.json()["pending"] == 4
    listed = answer.json()["timers"]
    assert [timer["id"] for timer in listed] == [beat.id, late.id, report.id, big.id]
    assert listed[0] == {
        "id": beat.id,
        "scope": "health",
        "key": "beats",
        "due": beat.due,
        "due_in": pytest.approx(600, abs=30),
        "every": 600,
        "cron": None,
        "tz": None,
        "value": None,
        "ops": '[{"type":"increment","path":""}]',
    }
    assert (listed[1]["value"], listed[1]["every"]) == (None, None)
    assert listed[1]["ops"] == '[{"op":"replace","path":"/state","value":"late"}]'
    assert listed[1]["due"] == late.due
    assert listed[2]["value"] == '{"state":"due","rate":1.0}'  # as stored: 1.0 stays 1.0
    assert listed[2]["ops"] is None
    # A long value is cut short, ending in "…" (which no JSON text ends in).
    shown = listed[3]["value"]
    assert len(shown) == TIMER_TEXT_MAX
    assert shown == '"' + "é" * (TIMER_TEXT_MAX - 2) + "…"


def test_at_most_so_many_timers_are_listed(client: Client, db_path: Any) -> None:
    count = TIMERS_MAX + 5
    write_elsewhere(
        db_path,
        f"""
        for n in range({count}):
            state.scope("jobs").schedule(f"j-{{n}}", n, after=3600 + n)
        """,
    )
    answer = client().get("/api/timers").json()
    assert answer["pending"] == count
    assert [timer["key"] for timer in answer["timers"]] == [f"j-{n}" for n in range(TIMERS_MAX)]


def test_cancelling_a_timer_is_refused_without_write(client: Client, db_path: Any) -> None:
    with reactor.open(db_path) as state:
        timer = state.scope("jobs").schedule("j-1", 1, after=3600)
        answer = client().post("/api/cancel_timer", json={"id": timer.id}, headers=HEADERS)
        assert answer.status_code == 403
        assert answer.json()["error"] == "Forbidden"
        assert "--write" in answer.json()["message"]
        assert state.timers() == [timer]


def test_cancelling_a_timer_with_write(client: Client, db_path: Any) -> None:
    with reactor.open(db_path) as state:
        jobs = state.scope("jobs")
        keep = jobs.schedule("j-1", 1, after=3600)
        drop = jobs.schedule("j-2", ops=[{"type": "increment", "path": "n"}], after=60, every=60)
        ui = client(write=True)
        body = json.dumps({"id": drop.id})
        # As every write: only from the page (JSON, and the dashboard's header).
        plain = {"Content-Type": "application/json"}
        assert ui.post("/api/cancel_timer", content=body, headers=plain).status_code == 403
        assert state.timers() == [drop, keep]
        answer = ui.post("/api/cancel_timer", content=body, headers=HEADERS)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"cancelled": True}
        assert state.timers() == [keep]
        assert [timer["id"] for timer in ui.get("/api/timers").json()["timers"]] == [keep.id]
        again = ui.post("/api/cancel_timer", content=body, headers=HEADERS)
        assert again.status_code == 404
        assert again.json()["error"] == "NotFound"
        assert f"no pending timer {drop.id!r}" in again.json()["message"]
        assert state.timers() == [keep]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ('{"id": 7}', 400, "InvalidArgumentError"),
        ('{"id": null}', 400, "InvalidArgumentError"),
        ('{"id": ["x"]}', 400, "InvalidArgumentError"),
        ('{"id": ""}', 400, "InvalidArgumentError"),
        ('{"id": "a\\u0000b"}', 400, "InvalidArgumentError"),  # PostgreSQL's text refuses NUL
        ('{"id": "\\ud800"}', 400, "InvalidArgumentError"),  # a lone surrogate: not UTF-8
        (json.dumps({"id": "x" * 201}), 400, "InvalidArgumentError"),
        ("{}", 400, "InvalidRequest"),
        ('{"id": "x", "scope": "jobs"}', 400, "InvalidRequest"),
        ('{"id": "' + "0" * 32 + '"}', 404, "NotFound"),
    ],
)
def test_cancelling_a_timer_by_a_bad_id(
    client: Client, db_path: Any, body: str, status: int, error: str
) -> None:
    with reactor.open(db_path) as state:
        timer = state.scope("jobs").schedule("j-1", 1, after=3600)
        answer = client(write=True).post("/api/cancel_timer", content=body, headers=HEADERS)
        assert answer.status_code == status, answer.text
        assert answer.json()["error"] == error
        assert len(answer.json()["message"]) < 200  # a long id is not repeated whole
        assert state.timers() == [timer]


def test_a_timers_write_is_marked_in_the_feed_and_the_history(db_path: Any) -> None:
    with (
        dashboard_thread(db_path) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT) as ui,
        feed(url) as events,
    ):
        assert next(events).event == "ready"
        with reactor.open(db_path) as state:
            jobs = state.scope("jobs")
            jobs.set("j-1", {"tries": 0})
            timer = jobs.schedule("j-1", ops=[{"type": "increment", "path": "tries"}], after=0.05)
            assert jobs.wait_for("j-1", lambda job: job["tries"] == 1, timeout=20)
        created, fired = (event.json() for event in take(events, 2))
        history = ui.get("/api/history", params={"scope": "jobs", "key": "j-1"}).json()
        value = ui.get("/api/value", params={"scope": "jobs", "key": "j-1"}).json()
        timers = ui.get("/api/timers").json()
    assert (created["timer"], created["version"]) == (None, 1)
    assert (fired["timer"], fired["version"], fired["type"]) == (timer.id, 2, "updated")
    assert [(c["revision"], c["version"], c["timer"]) for c in history["changes"]] == [
        (2, 2, timer.id),
        (1, 1, None),
    ]
    assert (value["version"], value["revision"], value["created_revision"]) == (2, 2, 1)
    assert timers == {"timers": [], "pending": 0}


# -- queues --------------------------------------------------------------------------
def _queues(ui: httpx.Client) -> dict[str, Any]:
    answer = ui.get("/api/queues")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _counts(listed: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each queue's ready, delayed, taken, dead and max_attempts."""
    return {
        queue["name"]: tuple(
            queue[name] for name in ("ready", "delayed", "taken", "dead", "max_attempts")
        )
        for queue in listed["queues"]
    }


def test_the_queues_with_their_counts(client: Client, db_path: Any) -> None:
    ui = client()
    assert _queues(ui) == {"queues": [], "count": 0, "dead": 0}
    with reactor.open(db_path) as state:
        emails = state.queue("emails", max_attempts=2)
        for n in range(3):
            emails.put({"n": n})
        emails.put("later", delay=600)
        state.queue("sms").put("x")
        listed = _queues(ui)
        assert [queue["name"] for queue in listed["queues"]] == ["emails", "sms"]
        assert _counts(listed) == {"emails": (3, 1, 0, 0, 2), "sms": (1, 0, 0, 0, 5)}
        assert (listed["count"], listed["dead"]) == (2, 0)
        first = listed["queues"][0]
        fields = "name max_attempts ready delayed taken dead taken_by_group rate_window"
        fields += " oldest_ready_age concurrency group_concurrency rate backoff"
        assert list(first) == fields.split()
        assert 0 <= first["oldest_ready_age"] < 60

        # Taken, then given back until dead: each count as Queue.stats() has it.
        job = emails.take(timeout=0)
        assert job is not None
        assert _counts(_queues(ui))["emails"] == (2, 1, 1, 0, 2)
        job.nack()
        assert _counts(_queues(ui))["emails"] == (3, 1, 0, 0, 2)
        job = emails.take(timeout=0)
        assert job is not None
        assert job.attempts == 1  # n=1 was first in line: n=0 went back behind n=2
        for _ in range(2):
            took = emails.take(timeout=0)
            assert took is not None
            took.ack()
        job.ack()
        again = emails.take(timeout=0)  # nothing ready: the delayed one is not due
        assert again is None
        emails.put("poison")
        for _ in range(2):
            took = emails.take(timeout=0)
            assert took is not None
            took.nack()  # the second time, its last attempt: dead
        listed = _queues(ui)
        assert (
            _counts(listed)["emails"] == (0, 1, 0, 1, 2) == (*list(emails.stats().values())[:4], 2)
        )
        assert listed["dead"] == 1
        # No job ready now: no age (the delayed job is not in line yet).
        assert listed["queues"][0]["oldest_ready_age"] is None
        # Reads write nothing.
        revision = state.stats()["revision"]
        _queues(ui)
        ui.get("/api/dead", params={"queue": "emails"})
        assert state.stats()["revision"] == revision


def test_at_most_so_many_queues_are_listed(client: Client, db_path: Any) -> None:
    count = QUEUES_MAX + 5
    write_elsewhere(
        db_path,
        f"""
        with state.scope("s").transaction() as tx:
            for n in range({count}):
                tx.enqueue(f"q-{{n:04}}", n)
        """,
    )
    listed = _queues(client())
    assert listed["count"] == count
    assert [queue["name"] for queue in listed["queues"]] == [f"q-{n:04}" for n in range(QUEUES_MAX)]


def test_the_dead_letters_of_a_queue(client: Client, db_path: Any) -> None:
    ui = client()
    with reactor.open(db_path) as state:
        flaky = state.queue("flaky", max_attempts=1)
        items = [{"n": 1.0}, "x" * (JOB_TEXT_MAX + 10), [1, 2]]
        for item in items:
            flaky.put(item)
        flaky.put("fine")
        deaths = []
        for _ in items:
            job = flaky.take(timeout=0)
            assert job is not None
            job.nack()  # its one attempt: dead
            deaths.append(time.time())
        answer = ui.get("/api/dead", params={"queue": "flaky"})
        assert answer.status_code == 200, answer.text
        dead = answer.json()
        assert (dead["queue"], dead["dead"]) == ("flaky", 3)
        assert [(job["id"], job["attempts"]) for job in dead["jobs"]] == [(1, 1), (2, 1), (3, 1)]
        assert [job["error"] for job in dead["jobs"]] == [None, None, None]  # none given
        # The item as stored JSON text (1.0 stays 1.0), a long one cut short with "…".
        assert dead["jobs"][0]["item"] == '{"n":1.0}'
        long = dead["jobs"][1]["item"]
        assert len(long) == JOB_TEXT_MAX
        assert long == '"' + "x" * (JOB_TEXT_MAX - 2) + "…"
        assert dead["jobs"][2]["item"] == "[1,2]"
        # When each died, in the order they died.
        died = [job["died"] for job in dead["jobs"]]
        assert died == sorted(died)
        for when, after in zip(died, deaths, strict=True):
            assert after - 30 < when <= after + 1
        # As many as asked; a queue without dead letters; a queue that does not exist.
        two = ui.get("/api/dead", params={"queue": "flaky", "limit": "2"}).json()
        assert ([job["id"] for job in two["jobs"]], two["dead"]) == ([1, 2], 3)
        state.queue("calm").put(1)
        assert ui.get("/api/dead", params={"queue": "calm"}).json() == {
            "queue": "calm",
            "jobs": [],
            "dead": 0,
        }
        missing = ui.get("/api/dead", params={"queue": "nothing"})
        assert missing.status_code == 404
        assert missing.json() == {"error": "NotFound", "message": "no queue 'nothing'"}
        for limit in ("0", "501", "-1", "x", "1.5"):
            bad = ui.get("/api/dead", params={"queue": "flaky", "limit": limit})
            assert bad.status_code == 400, limit
            assert bad.json()["error"] == "InvalidRequest"
        assert ui.get("/api/dead").json()["error"] == "InvalidRequest"  # no queue named


def test_retrying_dead_letters_is_refused_without_write(client: Client, db_path: Any) -> None:
    with reactor.open(db_path) as state:
        flaky = state.queue("flaky", max_attempts=1)
        flaky.put("x")
        job = flaky.take(timeout=0)
        assert job is not None
        job.nack()
        revision = state.stats()["revision"]
        answer = client().post("/api/retry_dead", json={"queue": "flaky"}, headers=HEADERS)
        assert answer.status_code == 403
        assert answer.json()["error"] == "Forbidden"
        assert "--write" in answer.json()["message"]
        assert flaky.stats()["dead"] == 1
        assert state.stats()["revision"] == revision


def test_retrying_dead_letters_with_write(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        flaky = state.queue("flaky", max_attempts=1)
        for n in range(3):
            flaky.put(n)
        for _ in range(2):
            job = flaky.take(timeout=0)
            assert job is not None
            job.nack()
        assert flaky.stats() == {
            "ready": 1,
            "delayed": 0,
            "taken": 0,
            "dead": 2,
            "taken_by_group": {},
            "rate_window": 0,
        }
        with (
            dashboard_thread(db_path, write=True) as url,
            httpx.Client(base_url=url, timeout=TIMEOUT) as ui,
            feed(url, {"scope": "queue:*"}) as events,
        ):
            assert next(events).event == "ready"
            body = json.dumps({"queue": "flaky"})
            # As every write: only from the page (JSON, and the dashboard's header).
            plain = {"Content-Type": "application/json"}
            assert ui.post("/api/retry_dead", content=body, headers=plain).status_code == 403
            assert flaky.stats()["dead"] == 2
            answer = ui.post("/api/retry_dead", content=body, headers=HEADERS)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"retried": 2}
            changes = [event.json() for event in take(events, 2)]
            listed = _counts(_queues(ui))
            again = ui.post("/api/retry_dead", content=body, headers=HEADERS)
            assert again.json() == {"retried": 0}
            missing = ui.post("/api/retry_dead", json={"queue": "nothing"}, headers=HEADERS)
            assert missing.status_code == 404
            assert missing.json()["error"] == "NotFound"
        assert flaky.stats() == {
            "ready": 3,
            "delayed": 0,
            "taken": 0,
            "dead": 0,
            "taken_by_group": {},
            "rate_window": 0,
        }
        assert listed == {"flaky": (3, 0, 0, 0, 1)}
        assert state.queues() == ["flaky"]  # "nothing" was not created
        # Ready again, attempts back to 0: one change each, of scope queue:NAME.
        assert [(c["scope"], c["key"], c["type"]) for c in changes] == [
            ("queue:flaky", "1", "updated"),
            ("queue:flaky", "2", "updated"),
        ]
        assert [(c["new_value"]["state"], c["new_value"]["attempts"]) for c in changes] == [
            ("ready", 0),
            ("ready", 0),
        ]
        jobs = [flaky.take(timeout=0) for _ in range(3)]
        assert [job.item for job in jobs if job is not None] == [2, 0, 1]


@pytest.mark.parametrize(
    ("body", "name", "error"),
    [
        ('{"queue": ""}', "", "InvalidKeyError"),
        ('{"queue": "a\\u0000b"}', "a\x00b", "InvalidKeyError"),  # PostgreSQL refuses NUL
        ('{"queue": "\\ud800"}', None, "InvalidKeyError"),  # a lone surrogate: not UTF-8
        # Too long: its events' scope, queue:NAME, would be too.
        (json.dumps({"queue": "q" * 1019}), "q" * 1019, "InvalidKeyError"),
        ('{"queue": 7}', None, "InvalidKeyError"),
        ('{"queue": null}', None, "InvalidKeyError"),
        ("{}", None, "InvalidRequest"),
        ('{"queue": "flaky", "max_attempts": 9}', None, "InvalidRequest"),
    ],
)
def test_a_bad_queue_name_is_400(
    client: Client, db_path: Any, body: str, name: str | None, error: str
) -> None:
    with reactor.open(db_path) as state:
        flaky = state.queue("flaky", max_attempts=1)
        flaky.put("x")
        job = flaky.take(timeout=0)
        assert job is not None
        job.nack()
        ui = client(write=True)
        answer = ui.post("/api/retry_dead", content=body, headers=HEADERS)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == error
        assert len(answer.json()["message"]) < 200  # a long name is not repeated whole
        if name is not None:
            read = ui.get("/api/dead", params={"queue": name})
            assert read.status_code == 400, read.text
            assert read.json()["error"] == error
        assert flaky.stats()["dead"] == 1
        assert state.queues() == ["flaky"]


# -- what a change shows ----------------------------------------------------------
def test_the_feed_shows_an_updates_patch_and_values_as_text(db_path: Any) -> None:
    with dashboard_thread(db_path) as url, feed(url) as events:
        assert next(events).event == "ready"
        write_elsewhere(
            db_path,
            """
            orders = state.scope("orders")
            orders.set("o-1", {"total": 1.0, "id": 2**60 + 1})
            orders.update("o-1", [{"type": "increment", "path": "total"}])
            orders.set("big", "x" * 200_000)
            orders.set("big", "y" * 200_000)
            orders.delete("o-1")
            """,
        )
        created, updated, _, big, deleted = (event.json() for event in take(events, 5))
    assert created["old_text"] is None
    assert created["new_text"] == '{"total":1.0,"id":1152921504606846977}'
    assert created["diff"] is None
    assert updated["diff"] == {
        "ops": [{"op": "replace", "path": "/total", "old": "1.0", "value": "2.0"}],
        "more": 0,
    }
    assert updated["old_value"] == {"total": 1.0, "id": 2**60 + 1}  # as_dict()'s fields stay
    assert len(big["old_text"]) + len(big["new_text"]) > MAX_DIFF_CHARS
    assert big["diff"] is None  # too large to diff for every follower: the page shows values
    assert (deleted["type"], deleted["new_text"]) == ("deleted", None)
    assert deleted["old_text"] == '{"total":2.0,"id":1152921504606846977}'


# -- the change feed, under uvicorn ----------------------------------------------------
def test_the_feed_shows_writes_from_another_process(db_path: Any) -> None:
    with dashboard_thread(db_path) as url, feed(url) as events:
        ready = next(events)
        assert ready.event == "ready"
        assert ready.id == "0"
        write_elsewhere(db_path, 'state.scope("orders").set("o-1", {"total": 120})')
        (change,) = take(events, 1)
    assert change.event == "change"
    assert change.id == "1"
    data = change.json()
    assert [data[name] for name in ("revision", "scope", "key", "type")] == [
        1,
        "orders",
        "o-1",
        "created",
    ]
    assert (data["old_value"], data["new_value"]) == (None, {"total": 120})
    assert (data["version"], data["timer"]) == (1, None)


def test_the_feed_filters_by_scope_and_key_globs(db_path: Any) -> None:
    with (
        dashboard_thread(db_path) as url,
        feed(url, {"scope": "ord*", "key": "o-?"}) as events,
    ):
        assert next(events).event == "ready"
        write_elsewhere(
            db_path,
            """
            state.scope("jobs").set("o-1", 1)       # another scope
            state.scope("orders").set("count", 1)   # another key
            state.scope("orders").set("o-10", 1)    # ? is one character
            state.scope("orders").set("o-1", {"total": 5})
            state.scope("orders").update("o-1", [{"type": "increment", "path": "total"}])
            state.scope("orders").delete("o-1")
            """,
        )
        changes = [event.json() for event in take(events, 3)]
    assert [(c["type"], c["key"], c["old_value"], c["new_value"]) for c in changes] == [
        ("created", "o-1", None, {"total": 5}),
        ("updated", "o-1", {"total": 5}, {"total": 6}),
        ("deleted", "o-1", {"total": 6}, None),
    ]
    assert [c["revision"] for c in changes] == [4, 5, 6]
    assert changes[1]["ops"][0]["type"] == "increment"


def test_the_feed_resumes_after_a_dropped_connection(db_path: Any) -> None:
    """As a browser's EventSource does: reconnect with Last-Event-ID, and get exactly
    the changes after it, those made while disconnected included."""
    with reactor.open(db_path) as state:
        for n in range(3):
            state.scope("s").set(f"k{n}", n)  # revisions 1-3, before the feed
    with dashboard_thread(db_path) as url:
        with feed(url) as events:
            assert next(events).id == "3"
            write_elsewhere(db_path, 'for n in range(3, 6): state.scope("s").set(f"k{n}", n)')
            seen = take(events, 2)
        assert [event.id for event in seen] == ["4", "5"]
        # Disconnected: revision 6 is pending, 7 and 8 are made now.
        write_elsewhere(db_path, 'state.scope("s").set("k6", 6); state.scope("s").set("k7", 7)')
        with feed(url, headers={"Last-Event-ID": seen[-1].id}) as events:
            ready = next(events)
            assert (ready.event, ready.id) == ("ready", "5")
            assert [event.id for event in take(events, 3)] == ["6", "7", "8"]
            write_elsewhere(db_path, 'state.scope("s").set("k8", 8)')
            (live,) = take(events, 1)
            assert live.id == "9"
            assert live.json()["key"] == "k8"
        # ``since`` does as Last-Event-ID on a first connection; the header wins.
        with feed(url, {"since": "1"}) as events:
            assert [event.id for event in take(events, 4)] == ["1", "2", "3", "4"]
        with feed(url, {"since": "1"}, {"Last-Event-ID": "7"}) as events:
            assert [event.id for event in take(events, 3)] == ["7", "8", "9"]


def test_the_feed_from_a_revision_the_database_has_not_reached(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    with dashboard_thread(db_path) as url, feed(url, {"since": "50"}) as events:
        ready = next(events)
        assert ready.id == "1"
        assert "ahead" in ready.json()["notice"]
        write_elsewhere(db_path, 'state.scope("s").set("k", 2)')
        assert take(events, 1)[0].id == "2"


def test_the_feed_from_a_revision_the_log_no_longer_holds(db_path: Any) -> None:
    write_elsewhere(
        db_path,
        """
        from reactor.testing import run_upkeep

        for n in range(6):
            state.scope('s').set('k', n)
        assert run_upkeep(state).log_compacted > 0
        """,
        options="log_retention=2",
    )
    with dashboard_thread(db_path) as url, feed(url, {"since": "1"}) as events:
        ready = next(events)
        assert ready.id == "6"  # from now on, saying so
        assert "the changes in between are not shown" in ready.json()["notice"]
        write_elsewhere(db_path, 'state.scope("s").set("k", 6)')
        assert take(events, 1)[0].id == "7"


def test_a_bad_since_is_400(db_path: Any) -> None:
    with dashboard_thread(db_path) as url, httpx.Client(timeout=10) as http:
        answer = http.get(url + "api/events", params={"since": "-1"})
        assert answer.status_code == 400
        assert answer.json()["error"] == "InvalidArgumentError"


def test_the_feed_pings_and_ends_when_the_client_goes(db_path: Any) -> None:
    with (
        dashboard_thread(db_path) as url,
        httpx.Client(timeout=10) as http,
    ):
        for _ in range(3):  # each stream's subscription ends with it
            with http.stream("GET", url + "api/events") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = response.iter_lines()
                pings = 0
                for line in lines:
                    pings += line.startswith(":")
                    if pings == 2:
                        break
                assert len(_subscriber_threads()) == 1
            deadline = time.monotonic() + 10
            while _subscriber_threads() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _subscriber_threads() == []


def _subscriber_threads() -> list[str]:
    """The subscription threads running in this process (each feed has one)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("reactor-subscriber")]


def test_the_server_stops_with_a_feed_open(db_path: Any) -> None:
    """A feed open does not hold the server up beyond its grace period. (Under the
    command, which handles the signals, the feed ends at once: see below.)"""
    with httpx.Client(timeout=10) as http:
        with dashboard_thread(db_path) as url:
            response = http.send(http.build_request("GET", url + "api/events"), stream=True)
            assert response.status_code == 200
            stopping = time.monotonic()
        stopped = time.monotonic() - stopping
        response.close()
    assert stopped < GRACE + 2, f"the server took {stopped:.1f} s to stop"
    assert _subscriber_threads() == []


# -- the command ------------------------------------------------------------------
def test_reactor_ui_serves_on_loopback_and_stops_on_ctrl_c(seeded: Any, tmp_path: Path) -> None:
    process, url, told = start_cli(seeded, cwd=tmp_path)
    try:
        assert url.startswith("http://127.0.0.1:")
        assert f"at {url} (read-only; Ctrl-C to stop)" in told
        assert "Warning" not in told
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200
        assert "<title>reactor</title>" in page.text
        assert httpx.get(url + "api/scopes", timeout=10).json()["scopes"]["orders"] == 3
        refused = httpx.post(url + "api/set", json={}, headers=HEADERS, timeout=10)
        assert refused.status_code == 403
        with feed(url) as events:  # a feed open when Ctrl-C comes ends, cleanly
            assert next(events).event == "ready"
            stopping = time.monotonic()
            _, err = stop_cli(process)
            stopped = time.monotonic() - stopping
            assert list(events) == []  # the stream ended, complete
    finally:
        stop_cli(process)
    assert process.returncode == 0, err
    assert stopped < GRACE, f"{stopped:.1f} s to stop"
    assert err == ""  # no traceback, no error logged


def test_reactor_ui_warns_when_listening_beyond_loopback(db_path: Any, tmp_path: Path) -> None:
    process, url, told = start_cli(db_path, "--host", "0.0.0.0", "--write", cwd=tmp_path)  # noqa: S104
    try:
        assert httpx.get(url + "api/info", timeout=10).json()["write"] is True
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err
    assert "Warning: listening on 0.0.0.0" in told
    assert "and change it" in told
    assert "(read-write; Ctrl-C to stop)" in told
    assert "add --allow-host NAME" in told
    assert socket.gethostname() in told  # among the names it answers to


def test_on_0_0_0_0_the_page_answers_to_the_machines_own_addresses(
    db_path: Any, tmp_path: Path
) -> None:
    """Opened by the address it was reached on (no name to rebind), the page answers;
    a name it was not given is still refused."""
    own = [
        found.address
        for addresses in psutil.net_if_addrs().values()
        for found in addresses
        if found.family == socket.AF_INET and not found.address.startswith("127.")
    ]
    if not own:
        pytest.skip("this machine has no IPv4 address beyond loopback")
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    process, url, _ = start_cli(db_path, "--host", "0.0.0.0", cwd=tmp_path)  # noqa: S104
    port = url.rstrip("/").rpartition(":")[2]
    try:
        page = httpx.get(f"http://{own[0]}:{port}/api/info", timeout=10)
        assert page.status_code == 200, page.text
        refused = httpx.get(
            f"http://{own[0]}:{port}/", headers={"Host": "rebound.example"}, timeout=10
        )
        assert refused.status_code == 400
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


def test_reactor_ui_logs_a_refused_host_name_with_the_fix(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        for _ in range(3):
            refused = httpx.get(url, headers={"Host": "dash.example:8765"}, timeout=10)
            assert refused.status_code == 400
            assert "--allow-host dash.example" in refused.text
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err
    assert err.count("refused a request") == 1, err  # once per name
    assert "reactor ui [--host ADDRESS ...] --allow-host dash.example" in err
    process, url, _ = start_cli(db_path, "--allow-host", "dash.example", cwd=tmp_path)
    try:
        allowed = httpx.get(url, headers={"Host": "dash.example:8765"}, timeout=10)
        assert allowed.status_code == 200
    finally:
        _, err = stop_cli(process)
    assert err == ""


def test_reactor_ui_errors_are_one_line(db_path: Any, tmp_path: Path) -> None:
    def fails(*args: str, status: int = 1) -> str:
        done = run_reactor(*args, cwd=tmp_path)
        assert done.returncode == status, (done.stdout, done.stderr)
        assert done.stderr.startswith("Error: "), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        return done.stderr

    missing = tmp_path / "missing.db"
    assert "no database at" in fails("--db", str(missing), "ui", "--port", "0", status=3)
    assert not missing.exists()
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert "cannot listen on 127.0.0.1:" in fails("--db", str(db_path), "ui", "--port", port)


def test_reactor_ui_without_the_ui_extra(tmp_path: Path) -> None:
    # As if starlette were not installed: the import fails, and the command says what to do.
    program = (
        "import sys; sys.modules['starlette'] = None; "
        "sys.argv = ['reactor', 'ui']; from reactor.cli import main; main()"
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
    assert done.returncode == 1
    assert done.stderr == "Error: reactor ui needs: pip install 'reactor-state[ui]'\n"


def test_sigterm_ends_reactor_ui_cleanly_too(db_path: Any, tmp_path: Path) -> None:
    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        # Serving (uvicorn has its signal handlers): as `kill` or `docker stop` find it.
        assert httpx.get(url + "api/info", timeout=10).status_code == 200
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)  # on its own: a Ctrl-C now would force the exit
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err
    assert "Traceback" not in err
