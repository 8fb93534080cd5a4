"""The dashboard's endpoint of derived values (``reactor._ui.derived_routes``): the
values live in the engine it shares with the program that made them, with their value,
revision, runs and last error. Driven over HTTP, as the page does."""

from __future__ import annotations

from typing import Any

import httpx

import reactor
from tests._ui_support import TIMEOUT
from tests.conftest import dashboard_thread, wait_for


def test_the_live_derived_values_are_listed_with_their_last_error(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("box").set("n", 2)
        ratio = state.derive(lambda r: 10 // r.scope("box").get("n"), name="ratio")
        state.count("box", name="keys in box")
        with dashboard_thread(db_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as ui:
            answer = ui.get("/api/derived")
            assert answer.status_code == 200, answer.text
            assert answer.json()["derived"] == [
                {
                    "name": "keys in box",
                    "value": "1",
                    "revision": 1,
                    "recomputations": 1,
                    "error": None,
                },
                {"name": "ratio", "value": "5", "revision": 1, "recomputations": 1, "error": None},
            ]
            state.scope("box").set("n", 0)
            wait_for(lambda: ratio.error is not None, 10)
            (shown,) = [d for d in ui.get("/api/derived").json()["derived"] if d["name"] == "ratio"]
            assert shown["value"] == "5"  # the last good one
            assert shown["error"] == "ZeroDivisionError: integer division or modulo by zero"
            ratio.close()
            names = [d["name"] for d in ui.get("/api/derived").json()["derived"]]
            assert names == ["keys in box"]
