"""``reactor serve``, run as a deployment runs it: a subprocess that keeps the upkeep
of a database nobody else keeps, answers health checks, and stops on a signal.

The test's own handle opens with ``sweep_interval=1e6``: its sweeper never runs a round
here, so that whatever is expired, fired or turned back was done by ``serve``.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pytest

import reactor
from tests.conftest import CLI_ENV, CLI_ON_SQLITE, wait_for

QUIET: Final = 1e6  # the test's sweep interval: its upkeep never runs
_LINE: Final = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: "
)


@dataclass
class Served:
    """A running ``reactor serve``: its process, and its log lines as they come."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_line(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        """The first line (from the start) that ``pattern`` matches, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.seen:
                found = re.search(pattern, line)
                if found:
                    return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matches {pattern!r}: {self.seen}")
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.lines.get(timeout=min(left, 0.2)))

    def url(self, what: str) -> str:
        return self.wait_line(rf"{what} at (http://\S+?)(?:;|$)")[1]

    def stop(self, how: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``how``, wait for the process to end; its exit status."""
        self.process.send_signal(how)
        return self.process.wait(timeout)

    def drain(self) -> list[str]:
        """Every line it logged (once it has ended)."""
        while True:
            try:
                self.seen.append(self.lines.get(timeout=2))
            except queue.Empty:
                return self.seen


@contextlib.contextmanager
def served(db: Any, *args: str) -> Iterator[Served]:
    """``reactor --db DB serve ARGS``, running until the block ends (then stopped)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "reactor", "--db", str(db), "serve", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=CLI_ENV,
    )
    running = Served(process)

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            running.lines.put(line.rstrip("\n"))
        running.lines.put("<end>")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        running.wait_line(r"INFO reactor\.serve: serving ")
        yield running
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        reader.join(10)
        if process.stderr is not None:
            process.stderr.close()


def _get(url: str) -> tuple[int, Any]:
    """GET ``url``: the status and the JSON body."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _answer_of(url: str, status: int, timeout: float = 10.0) -> Any:
    """The JSON body of the first answer of ``url`` with ``status``, waiting for it."""
    seen: list[tuple[int, Any]] = []

    def answered() -> Any:
        seen.append(_get(url))
        return seen[-1][1] if seen[-1][0] == status else None

    try:
        return wait_for(answered, timeout=timeout, interval=0.1)
    except pytest.fail.Exception:
        raise AssertionError(f"{url} never answered {status}: {seen[-3:]}") from None


def test_serve_keeps_the_upkeep_nobody_else_keeps(db_path: Any) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        events: list[reactor.ChangeEvent] = []
        state.subscribe(events.append, scope="s")
        scope = state.scope("s")
        scope.set("gone", 1, ttl=0.3)
        timer = scope.schedule("rung", "ring", after=0.3)
        jobs = state.queue("q")
        jobs.put("job")
        taken = jobs.take(timeout=5, lease=0.3)
        assert taken is not None
        time.sleep(0.5)
        assert jobs.job(taken.id).errors == []  # nobody has turned the lease back yet
        with served(db_path) as server:
            wait_for(
                lambda: (
                    {(event.key, event.type) for event in events}
                    >= {("gone", "expired"), ("rung", "created")}
                )
            )
            assert scope.get("rung") == "ring"
            [fired] = [event for event in events if event.key == "rung"]
            assert fired.timer == timer.id
            wait_for(lambda: jobs.job(taken.id).errors)
            assert "lease" in jobs.job(taken.id).errors[0]["error"]
            again = jobs.take(timeout=5)
            assert again is not None
            assert again.attempts == 2
            again.ack()
            server.wait_line(r"INFO reactor\.upkeep: keys of 's' expired: 1$")
            server.wait_line(r"INFO reactor\.upkeep: timers of 's' fired: 1$")
            server.wait_line(r"INFO reactor\.upkeep: jobs whose lease ran out, turned back: 1$")
            assert server.stop() == 0
        lines = server.drain()
        assert lines[-2:] == [lines[-2], "<end>"]
        assert lines[-2].endswith("reactor.serve: stopped")
        assert all(_LINE.match(line) for line in lines[:-1]), lines
        assert [event.key for event in events if event.type == "expired"] == ["gone"]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_cleanly(db_path: Any, how: signal.Signals) -> None:
    with served(db_path, "--interval", "0.05") as server:
        server.wait_line(r"upkeep every 0\.05 s")
        time.sleep(0.3)  # rounds go on
        assert server.stop(how) == 0
    lines = server.drain()
    assert (
        f"INFO reactor.serve: {how.name}: stopping once the upkeep's chore under way is done"
        in (lines[-3])
    )
    assert lines[-2].endswith("INFO reactor.serve: stopped")
    # Released: another program writes at once (no lock, no actor left behind).
    with reactor.open(db_path, timeout=2) as state:
        state.scope("s").set("k", 1)


def test_the_health_endpoints_report_the_upkeep(db_path: Any) -> None:
    with served(db_path, "--health", "0") as server:
        url = server.url("health")
        assert url.endswith("/healthz")
        base = url.removesuffix("healthz")

        def after_a_round() -> tuple[int, Any] | None:
            answer = _get(url)
            return answer if answer[1]["upkeep"]["rounds"] else None

        status, body = wait_for(after_a_round)
        assert status == 200
        assert body["status"] == "ok"
        assert body["problems"] == []
        assert body["pid"] == server.process.pid
        assert body["database"] == str(db_path) or body["database"].startswith("postgresql")
        upkeep = body["upkeep"]
        assert set(upkeep) == {
            "overdue",
            "rounds",
            "last_round_age",
            "busy_for",
            "failing",
            "failing_for",
            "last_error",
            "running",
        }
        assert upkeep["overdue"] == 0.0
        assert upkeep["failing"] == 0
        assert upkeep["running"]
        assert 0 <= upkeep["last_round_age"] < 5
        assert _get(base + "livez") == (200, {"status": "ok", "problems": []})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + "nothing", timeout=10)  # noqa: S310 - loopback


@pytest.mark.sqlite_only("holds SQLite's write lock from outside to stall the upkeep")
def test_health_fails_while_the_upkeep_falls_behind_and_recovers(db_path: Any) -> None:
    with served(db_path, "--health", "0", "--max-lag", "0.5") as server:
        url = server.url("health")
        blocker = sqlite3.connect(db_path, timeout=10, isolation_level=None)
        try:
            with reactor.open(db_path, sweep_interval=QUIET) as state:
                state.scope("s").set("k", 1, ttl=1.0)
            blocker.execute("BEGIN IMMEDIATE")  # before it is due: nobody can expire it
            body = _answer_of(url, 503)
            assert body["status"] == "failing"
            assert any("oldest due work has waited" in problem for problem in body["problems"])
            assert body["upkeep"]["overdue"] > 0.5
        finally:
            blocker.rollback()
            blocker.close()
        body = _answer_of(url, 200, timeout=60)
        assert body["upkeep"]["overdue"] == 0.0
        server.wait_line(r"keys of 's' expired: 1$")


@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_the_dashboard_runs_beside_the_upkeep(db_path: Any) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        state.scope("s").set("k", {"a": 1})
    with served(db_path, "--ui", "--port", "0", "--health", "0") as server:
        page = server.url("dashboard")
        with urllib.request.urlopen(page, timeout=10) as response:  # noqa: S310 - loopback
            assert response.status == 200
            assert b"<html" in response.read().lower()
        assert _get(page + "api/info")[1]["write"] is False
        assert _get(page + "api/value?scope=s&key=k")[1]["value"] == {"a": 1}
        assert _get(server.url("health"))[0] == 200
        assert server.stop() == 0


@pytest.mark.sqlite_only("refused before any database is opened")
def test_bad_options_are_usage_errors(db_path: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reactor", "--db", str(db_path), "serve", "--health", "nope"],
        capture_output=True,
        text=True,
        env=CLI_ENV,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "'nope' is not a port, nor HOST:PORT" in done.stderr
    for option in ("--interval", "--max-lag", "--timeout"):
        done = subprocess.run(
            [sys.executable, "-m", "reactor", "--db", str(db_path), "serve", option, "nan"],
            capture_output=True,
            text=True,
            env=CLI_ENV,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (option, done.stderr)
        assert "'nan' is not a number of seconds" in done.stderr
    assert not db_path.exists()


@pytest.mark.sqlite_only(CLI_ON_SQLITE)
def test_a_port_in_use_is_one_line(db_path: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "reactor", "--db", str(db_path), "serve", "--health", str(port)],
            capture_output=True,
            text=True,
            env=CLI_ENV,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}: "), done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.sqlite_only("removes the database file under the running serve")
def test_a_removed_database_file_ends_it_with_one_error(db_path: Any) -> None:
    """Nothing it does can reach the file at the path any more: it stops (exit 1, so
    that a supervisor starts it again on the file now there), saying why, instead of
    failing every round for ever."""
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        state.scope("s").set("k", 1, ttl=0.2)
    with served(db_path, "--interval", "0.05", "--health", "0") as server:
        base = server.url("health").removesuffix("healthz")
        db_path.unlink()
        assert server.process.wait(20) == 1
        lines = server.drain()
    text = "\n".join(lines)
    assert "removed or replaced while open: the upkeep stops" in text
    assert "the upkeep's thread has ended: stopping" in text
    assert sum("failed" in line for line in lines) <= 2, lines
    with pytest.raises(urllib.error.URLError):
        _get(base + "livez")


@pytest.mark.sqlite_only("holds SQLite's write lock from outside")
def test_a_lock_held_elsewhere_keeps_it_alive_and_a_signal_still_stops_it_soon(
    db_path: Any,
) -> None:
    """Another process holds the write lock: chores wait and fail, which is no reason
    to restart this process (liveness stays 200, readiness says why), and SIGTERM ends
    it within about one chore's timeout, not a wait per chore."""
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        state.scope("s").set("k", 1, ttl=0.1)
    args = ("--interval", "0.05", "--health", "0", "--max-lag", "0.3", "--timeout", "1")
    with served(db_path, *args) as server:
        base = server.url("health").removesuffix("healthz")
        blocker = sqlite3.connect(db_path, timeout=10, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                assert _get(base + "livez") == (200, {"status": "ok", "problems": []})
                time.sleep(0.1)
            body = _answer_of(base + "healthz", 503)
            assert any("the upkeep has failed for" in problem for problem in body["problems"])
            assert body["upkeep"]["failing"] >= 1
            started = time.monotonic()
            assert server.stop(timeout=20) == 0
            assert time.monotonic() - started < 6
        finally:
            blocker.rollback()
            blocker.close()
        lines = server.drain()
    assert lines[-2].endswith("INFO reactor.serve: stopped"), lines[-3:]


def test_signals_in_a_row_stop_it_once(db_path: Any) -> None:
    with served(db_path, "--interval", "0.05") as server:
        for _ in range(3):
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.02)
        assert server.process.wait(30) == 0
        lines = server.drain()
    assert sum("stopping once" in line for line in lines) == 1, lines
    assert lines[-2].endswith("INFO reactor.serve: stopped")


@pytest.mark.postgresql_only
def test_readiness_probes_of_a_locked_database_answer_in_time_on_one_connection(
    db_path: Any,
) -> None:
    """A table locked against readers (``LOCK TABLE ... ACCESS EXCLUSIVE``): each probe
    answers 503 within its read's 5 s, and twenty probes at once wait on one read, not
    on twenty connections."""
    import psycopg
    import sqlalchemy as sa

    url = sa.make_url(db_path).set(drivername="postgresql")
    conninfo = url.set(query={}).render_as_string(hide_password=False)
    with served(db_path, "--health", "0", "--timeout", "30") as server:
        base = server.url("health").removesuffix("healthz")
        assert _get(base + "healthz")[0] == 200
        options = url.query.get("options")
        with (
            psycopg.connect(conninfo, options=options, autocommit=True) as locker,
            psycopg.connect(conninfo, autocommit=True) as watcher,
        ):
            with locker.transaction():
                locker.execute("LOCK TABLE reactor_kv IN ACCESS EXCLUSIVE MODE")
                answers: list[tuple[int, Any]] = []
                started = time.monotonic()
                probes = [
                    threading.Thread(target=lambda: answers.append(_get(base + "healthz")))
                    for _ in range(20)
                ]
                for probe in probes:
                    probe.start()
                time.sleep(2)
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                for probe in probes:
                    probe.join(30)
                took = time.monotonic() - started
            assert len(answers) == 20
            assert {status for status, _ in answers} == {503}
            assert all(
                body["problems"] == ["the database did not answer within 5 s"]
                for _, body in answers
            )
            assert took < 15
            # The probes' one read, and the upkeep's own chores (a read and a write).
            assert waiting is not None
            assert waiting[0] <= 3, waiting
        assert _get(base + "livez")[0] == 200
        assert _answer_of(base + "healthz", 200, timeout=40)["status"] == "ok"


@pytest.mark.sqlite_only("a PostgreSQL server that is not there: no test database needed")
def test_a_server_it_cannot_reach_is_one_line() -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
    done = subprocess.run(
        [sys.executable, "-m", "reactor", "--db", url, "serve"],
        capture_output=True,
        text=True,
        env=CLI_ENV,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3  # storage
    assert done.stderr.startswith(f"Error: cannot open {url}: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
