"""``reactor.ui.create_app``: the dashboard of an open ``State``, mounted under a prefix
of the user's own Starlette app behind the user's login, served by a real uvicorn."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

import reactor
from reactor.ui import create_app
from tests._ui_support import HEADERS, TIMEOUT
from tests.conftest import asgi_thread

LOGIN = {"Authorization": "Bearer s3cret"}


class RequireLogin:
    """The user's own login: a bearer token, else 401."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and Request(scope).headers.get("authorization") != (LOGIN["Authorization"])
        ):
            await PlainTextResponse("log in first", status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _users_app(state: reactor.State, **options: Any) -> Starlette:
    dashboard = create_app(state, **options)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with dashboard.router.lifespan_context(dashboard):
            yield

    return Starlette(
        routes=[Mount("/reactor", app=dashboard, middleware=[Middleware(RequireLogin)])],
        lifespan=lifespan,
    )


@pytest.fixture
def mounted(db_path: Any) -> Iterator[tuple[reactor.State, httpx.Client]]:
    """An open state, and a client of the user's app with the dashboard at /reactor."""
    with (
        reactor.open(db_path) as state,
        asgi_thread(_users_app(state, write=True)) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT) as client,
    ):
        yield state, client


def test_without_the_login_every_path_of_the_dashboard_is_401(
    mounted: tuple[reactor.State, httpx.Client],
) -> None:
    _, client = mounted
    for path in ("/reactor/", "/reactor/api/info", "/reactor/static/app.js", "/reactor/api/events"):
        assert client.get(path).status_code == 401, path
    refused = client.post("/reactor/api/set", json={"scope": "s", "key": "k", "value": 1})
    assert refused.status_code == 401


def test_logged_in_the_page_and_its_assets_load_under_the_prefix(
    mounted: tuple[reactor.State, httpx.Client],
) -> None:
    state, client = mounted
    page = client.get("/reactor", headers=LOGIN, follow_redirects=True)
    assert page.status_code == 200
    assert str(page.url).endswith("/reactor/")
    assets = re.findall(r'(?:href|src)="(static/[^"]+)"', page.text)
    assert "static/app.js" in assets
    assert "static/style.css" in assets
    for asset in assets:  # relative: under the prefix
        loaded = client.get("/reactor/" + asset, headers=LOGIN)
        assert loaded.status_code == 200, asset
    info = client.get("/reactor/api/info", headers=LOGIN).json()
    assert info["write"] is True
    assert info["database"] == state.stats()["database"]


def test_logged_in_the_api_reads_and_writes_the_users_state(
    mounted: tuple[reactor.State, httpx.Client],
) -> None:
    state, client = mounted
    state.scope("orders").set("o-1", {"total": 120})
    keys = client.get("/reactor/api/keys", params={"scope": "orders"}, headers=LOGIN)
    assert keys.json()["keys"] == ["o-1"]
    written = client.post(
        "/reactor/api/set",
        json={"scope": "orders", "key": "o-2", "value": {"total": 80}},
        headers={**HEADERS, **LOGIN},
    )
    assert written.status_code == 200, written.text
    assert state.scope("orders").get("o-2") == {"total": 80}
    with connect_sse(client, "GET", "/reactor/api/events", headers=LOGIN) as source:
        ready = next(iter(source.iter_sse()))
    assert ready.event == "ready"


def test_the_app_leaves_the_users_state_open_and_stops_its_threads(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        with asgi_thread(_users_app(state)) as url:
            answer = httpx.get(url + "reactor/api/scopes", headers=LOGIN, timeout=TIMEOUT)
            assert answer.status_code == 200
        assert not state.closed
        state.scope("s").set("k", 1)  # still the user's, and open
        left = [thread.name for thread in threading.enumerate()]
        assert not [name for name in left if name.startswith(("reactor-aio", "reactor-ui"))]


def test_the_host_check_is_off_unless_asked(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        with asgi_thread(create_app(state)) as url:
            other = httpx.get(url + "api/info", headers={"Host": "dash.example"}, timeout=TIMEOUT)
            assert other.status_code == 200
        with asgi_thread(create_app(state, hosts=["127.0.0.1"])) as url:
            other = httpx.get(url + "api/info", headers={"Host": "dash.example"}, timeout=TIMEOUT)
            assert other.status_code == 400


def test_create_app_wants_an_open_state(db_path: Any) -> None:
    state = reactor.open(db_path)
    state.close()
    with pytest.raises(reactor.ClosedError):
        create_app(state)
    with pytest.raises(TypeError, match=r"reactor\.State"):
        create_app(db_path)
