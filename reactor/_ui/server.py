"""Running the dashboard: a listening socket, then uvicorn until Ctrl-C.

The socket is bound before uvicorn starts, so that a port in use is an error the
command line can put in one line, and so that ``--port 0`` can print the port it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Final

import uvicorn
from starlette.types import ASGIApp

from .app import create_app
from .feed import DEFAULT_PING
from .guard import allowed_hosts, is_loopback

__all__ = [
    "allowed_hosts",
    "app_config",
    "is_loopback",
    "listen",
    "serve",
    "serve_until",
    "url_of",
]

# Seconds uvicorn gives open connections to end once told to stop. The change feeds end
# on their own at once (see ``feed``); this bounds anything else.
GRACE: Final = 3
STOP_POLL: Final = 0.1  # seconds between looks at a stop event (uvicorn's own tick)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (``port`` 0: a free one).

    Raises:
        OSError: the address does not resolve, or cannot be listened on.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def url_of(listener: socket.socket) -> str:
    """The page's address: a loopback one when the socket listens on every address."""
    host, port = listener.getsockname()[:2]
    if host in ("0.0.0.0", "::"):  # noqa: S104 - read from the socket, not a bind
        host = "127.0.0.1" if listener.family == socket.AF_INET else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def config(
    listener: socket.socket,
    target: str | os.PathLike[str] | None,
    *,
    write: bool,
    hosts: list[str],
    ping: float = DEFAULT_PING,
) -> uvicorn.Config:
    """uvicorn's configuration for the dashboard of ``target`` on ``listener``."""
    return app_config(create_app(target, write=write, hosts=hosts, ping=ping), listener)


def app_config(app: ASGIApp, listener: socket.socket) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` on ``listener``."""
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=GRACE,
        host=listener.getsockname()[0],
        port=listener.getsockname()[1],
    )


def serve(
    listener: socket.socket,
    target: str | os.PathLike[str] | None,
    *,
    write: bool,
    hosts: list[str],
) -> None:
    """Serve the dashboard on ``listener`` until SIGINT or SIGTERM; return once it has
    shut down."""
    server = _Server(config(listener, target, write=write, hosts=hosts))
    server.run(sockets=[listener])


class _Server(uvicorn.Server):
    """uvicorn's server, ending on SIGINT or SIGTERM without raising the signal again.

    uvicorn raises a signal it caught once more as its loop ends, so that the program
    sees it: the ``KeyboardInterrupt`` then interrupts the event loop while the app's
    lifespan task is still finishing, which logs a traceback on a clean stop.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve_until(apps: list[tuple[ASGIApp, socket.socket]], done: Callable[[], bool]) -> bool:
    """Serve each app on its socket until ``done()`` (asked every ``STOP_POLL`` s) or
    until a server ends by itself (it could not start, say); then stop them all. Whether
    ``done()`` ended it. The caller handles the signals."""

    async def run() -> bool:
        servers = [(_Managed(app_config(app, listener)), listener) for app, listener in apps]
        serving = [asyncio.create_task(server.serve([listener])) for server, listener in servers]
        ended = False
        while not (ended := done()) and not any(task.done() for task in serving):
            await asyncio.sleep(STOP_POLL)
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*serving, return_exceptions=True)
        return ended

    return asyncio.run(run())


class _Managed(uvicorn.Server):
    """uvicorn's server, leaving the signals to its caller."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
