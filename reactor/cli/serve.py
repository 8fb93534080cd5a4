"""``reactor serve``: the long-running process of a deployment.

It opens the database for writing and keeps its upkeep: keys past their TTL expire
with their events, due timers fire, leases run out are turned back, the change log is
compacted (the engine's sweeper, which every writing program runs; this one runs
nothing else). On request it serves the dashboard (``--ui``), health endpoints
(``--health``) and Prometheus metrics (``--metrics``: ``reactor.metrics``' collector,
with the process's own, at ``/metrics`` on a port of its own). SIGTERM or SIGINT
stops it cleanly: the upkeep round under way finishes, then everything is released,
and it exits 0.

Several ``serve`` processes may keep one database: each chore reads what is due again
inside its own transaction, so none is done twice.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType, ModuleType
from typing import Any, Final

import click

from reactor import open as open_state
from reactor._engine.options import MAX_TIMEOUT, SWEEP_INTERVALS
from reactor._handles.binding import engine_of
from reactor._handles.run_workers import Workers
from reactor._handles.state import State
from reactor.errors import InvalidArgumentError

from .group import Command
from .logs import show_service_log
from .options import DB, DB_HELP, remember
from .programs import dashboard_options, import_web, listen, warn_beyond_loopback

__all__ = ["COMMANDS"]

logger = logging.getLogger("reactor.serve")

DEFAULT_INTERVAL: Final = 0.25  # seconds between upkeep rounds (the engine's default)
DEFAULT_MAX_LAG: Final = 60.0  # reactor._ui.health.DEFAULT_MAX_LAG (imported when used)
# Seconds a chore waits for a lock: shorter than a program's default (30), since a
# chore that gives up is tried again next round, and a stop waits for it.
DEFAULT_TIMEOUT: Final = 5.0
ALIVE_CHECK: Final = 1.0  # seconds between looks at the upkeep's thread, without HTTP
_LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


class Seconds(click.FloatRange):
    """A number of seconds within bounds: not NaN (which every comparison lets through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


class HostPort(click.ParamType[tuple[str, int]]):
    """``PORT`` or ``HOST:PORT`` (``[::1]:PORT`` for IPv6): where to listen; the host
    is the loopback address unless given."""

    name = "[HOST:]PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        host, _, port = str(value).rpartition(":")
        host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            self.fail(f"{value!r} is not a port, nor HOST:PORT", param, ctx)
        return host, int(port)


@click.command(cls=Command)
@click.option("--db", metavar="PATH|URL", expose_value=False, callback=remember, help=DB_HELP)
@click.option(
    "--interval",
    type=Seconds(*SWEEP_INTERVALS),
    default=DEFAULT_INTERVAL,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between upkeep rounds (a due timer fires on time whatever this is).",
)
@click.option(
    "--health",
    type=HostPort(),
    metavar="[HOST:]PORT",
    help="Serve GET /livez and /healthz on this port (on 127.0.0.1 unless HOST is given).",
)
@click.option(
    "--metrics",
    type=HostPort(),
    metavar="[HOST:]PORT",
    help="Serve GET /metrics (Prometheus) on this port (on 127.0.0.1 unless HOST is given).",
)
@click.option(
    "--max-lag",
    type=Seconds(0.1, MAX_TIMEOUT),
    default=DEFAULT_MAX_LAG,
    show_default=True,
    metavar="SECONDS",
    help="How far the upkeep may fall behind before the health endpoints answer 503.",
)
@click.option(
    "--timeout",
    type=Seconds(0.1, MAX_TIMEOUT),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="How long a chore waits for another process's lock before it is tried again "
    "next round (a stop waits for the chore under way: about this at most).",
)
@click.option(
    "--workflows",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE (a dotted name, found from the current folder too) and serve the "
    "durable workflows it registers on this database; may be repeated.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    metavar="N",
    help="Worker threads running workflows' runs (with --workflows).",
)
@click.option("--ui", is_flag=True, help="Serve the dashboard too (see reactor ui).")
@dashboard_options
@click.option(
    "--log-level",
    type=click.Choice(list(_LEVELS)),
    default="info",
    show_default=True,
    help="The least severe messages shown (info: one line per chore that did something).",
)
def serve(
    interval: float,
    health: tuple[str, int] | None,
    metrics: tuple[str, int] | None,
    max_lag: float,
    timeout: float,
    modules: tuple[str, ...],
    concurrency: int,
    ui: bool,
    host: str,
    port: int,
    write: bool,
    allow_hosts: tuple[str, ...],
    log_level: str,
) -> None:
    """Keep the database's upkeep until SIGTERM: expire keys, fire timers, turn back
    leases, compact the log; serve health checks and the dashboard if asked.

    Several serve processes may share one database: no chore is done twice.
    """
    show_service_log(_LEVELS[log_level])
    target: str | None = click.get_current_context().meta.get(DB)
    web = import_web("reactor serve --health/--metrics/--ui") if health or metrics or ui else None
    if metrics is not None:
        _check_metrics()
    with _signals() as stop:  # from here on, a signal stops it cleanly
        state = open_state(target, sweep_interval=interval, timeout=timeout)
        workers = None
        try:
            workers = _workers(state, target, modules, concurrency)
            apps = _apps(web, state, health, metrics, max_lag)
            apps += _dashboard(web, target, ui, host, port, write, allow_hosts)
            where = "".join(f"; {what} at {url}" for what, url, _, _ in apps)
            if workers is not None:
                where += f"; workflows {', '.join(workers.workflows)} ({concurrency} workers)"
            logger.info(
                "serving %s (pid %d): upkeep every %g s%s",
                state.location,
                os.getpid(),
                interval,
                where,
            )
            _run(web, state, [(app, listener) for _, _, app, listener in apps], stop)
        finally:
            if workers is not None:
                workers.stop()  # the runs under way are given back at their next step
            state.close()  # the sweeper's round under way finishes first
    if not stop.is_set():
        raise click.ClickException("stopped: the upkeep or a server ended by itself")
    logger.info("stopped")


@contextlib.contextmanager
def _signals() -> Iterator[threading.Event]:
    """An event that SIGTERM and SIGINT set (instead of ending the program) while in
    the block."""
    stop = threading.Event()

    def on_signal(number: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            return
        stop.set()
        logger.info(
            "%s: stopping once the upkeep's chore under way is done", signal.Signals(number).name
        )

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            # Once stopping, further signals are ignored: the interpreter resets Python
            # handlers to the default as it exits, and one then would kill it (-15).
            signal.signal(sig, signal.SIG_IGN if stop.is_set() else handler)


def _workers(
    state: State, target: str | None, modules: tuple[str, ...], concurrency: int
) -> Workers | None:
    """Import ``modules`` and serve the workflows they registered on ``state``'s
    database (None: no module).

    Raises:
        click.ClickException: a module cannot be imported, or registered nothing.
    """
    if not modules:
        return None
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: the project's own modules
    # A module opens the database its own way: reactor.open(os.environ["REACTOR_DB"]).
    os.environ["REACTOR_DB"] = target or state.location  # the URL as given: its password
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - whatever the module raised: one line
            raise click.ClickException(
                f"cannot import {module}: {type(exc).__name__}: {exc}"
            ) from None
    try:
        return state.serve(concurrency=concurrency)
    except InvalidArgumentError:
        raise click.ClickException(
            f"{', '.join(modules)} registered no workflow on {state.location} "
            "(a module registers with @state.workflow on a handle to this database)"
        ) from None


def _check_metrics() -> None:
    """
    Raises:
        click.ClickException: the ``metrics`` extra is not installed.
    """
    try:
        import prometheus_client  # noqa: F401
    except ModuleNotFoundError:
        raise click.ClickException(
            "reactor serve --metrics needs: pip install 'reactor-state[metrics]'"
        ) from None


def _apps(
    web: ModuleType | None,
    state: State,
    health: tuple[str, int] | None,
    metrics: tuple[str, int] | None,
    max_lag: float,
) -> list[tuple[str, str, Any, socket.socket]]:
    """The health and metrics apps asked for: (what, its URL, the app, its listening
    socket)."""
    if web is None:
        return []
    apps: list[tuple[str, str, Any, socket.socket]] = []
    if health is not None:
        from reactor._ui.health import create_health_app

        listener = listen(web, *health)
        app = create_health_app(engine_of(state), max_lag)
        apps.append(("health", web.url_of(listener) + "healthz", app, listener))
    if metrics is not None:
        from prometheus_client import REGISTRY

        from reactor._ui.metrics import create_metrics_app
        from reactor.metrics import register

        listener = listen(web, *metrics)
        register(state)  # on the default registry, with the process's own metrics
        app = create_metrics_app(REGISTRY)
        apps.append(("metrics", web.url_of(listener) + "metrics", app, listener))
    return apps


def _dashboard(
    web: ModuleType | None,
    target: str | None,
    ui: bool,
    host: str,
    port: int,
    write: bool,
    allow_hosts: tuple[str, ...],
) -> list[tuple[str, str, Any, socket.socket]]:
    """The dashboard, if asked for: (what, its URL, the app, its listening socket)."""
    apps: list[tuple[str, str, Any, socket.socket]] = []
    if web is not None and ui:
        from reactor._ui.app import create_app

        listener = listen(web, host, port)
        url = web.url_of(listener)
        hosts = web.allowed_hosts(host, allow_hosts)
        if not web.is_loopback(host):
            warn_beyond_loopback(host, url, hosts, write=write)
        app = create_app(target, write=write, hosts=hosts)
        apps.append(("dashboard" + (" (read-write)" if write else ""), url, app, listener))
    return apps


def _run(
    web: ModuleType | None,
    state: State,
    apps: list[tuple[Any, socket.socket]],
    stop: threading.Event,
) -> None:
    """Run until ``stop`` is set, or until the upkeep's thread or a server ends by
    itself."""

    def done() -> bool:
        return stop.is_set() or not _alive(state)

    if web is not None and apps:
        web.serve_until(apps, done)
    else:
        while not stop.wait(ALIVE_CHECK) and _alive(state):
            pass


def _alive(state: State) -> bool:
    """Whether the upkeep's thread still runs (it ends only when the engine closes)."""
    progress = engine_of(state).upkeep_progress()
    if progress is None or not progress.running:
        why = None if progress is None else progress.last_error
        logger.error("the upkeep's thread has ended: stopping (%s)", why or "no error")
        return False
    return True


COMMANDS: Final = (serve,)
