"""What the dashboard's tests share: the dashboard in a thread or in a process, another
process writing, and the change feed read as Server-Sent Events."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent, connect_sse

from tests.conftest import CLI_ENV

HEADERS = {"Content-Type": "application/json", "X-Reactor-UI": "1"}
TIMEOUT = httpx.Timeout(10.0)  # no read waits longer: the feed pings every 0.2 s here


def start_cli(db: Any, *args: str, cwd: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """``reactor --db DB ui --port 0 ARGS`` in a process, the URL it printed, and what
    it wrote on stderr until then."""
    process = subprocess.Popen(
        [sys.executable, "-m", "reactor", "--db", str(db), "ui", "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: select() sees what is still to read
        env=CLI_ENV,
    )
    try:
        told = _read_until(process, "reactor ui:")
    except BaseException:
        stop_cli(process)
        raise
    found = re.search(r"http://\S+/", told)
    assert found is not None, told
    return process, found.group(0), told


def stop_cli(process: subprocess.Popen[bytes], timeout: float = 15.0) -> tuple[str, str]:
    """Ctrl-C the process; its stdout and stderr once it has ended (killed if it hangs)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=10)
        pytest.fail(f"the dashboard did not stop within {timeout} s of SIGINT")
    return out.decode(), err.decode()


def _read_until(process: subprocess.Popen[bytes], text: str, timeout: float = 30.0) -> str:
    """What the process writes on stderr, up to the end of the line holding ``text``."""
    assert process.stderr is not None
    descriptor = process.stderr.fileno()
    told = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([descriptor], [], [], left)
        if not ready:
            continue
        chunk = os.read(descriptor, 65536)
        if not chunk:
            break  # the process ended
        told += chunk
        decoded = told.decode(errors="replace")
        at = decoded.find(text)
        if at >= 0 and "\n" in decoded[at:]:
            return decoded
    pytest.fail(f"no line with {text!r} within {timeout} s; stderr: {told.decode()!r}")


def write_elsewhere(db: Any, script: str, options: str = "") -> None:
    """Run ``script`` in another Python process, with ``state`` open on ``db`` (and
    ``options``, keyword arguments of ``reactor.open`` as source text)."""
    opening = f"reactor.open(sys.argv[1]{', ' + options if options else ''})"
    program = f"import sys, reactor\nwith {opening} as state:\n"
    program += textwrap.indent(textwrap.dedent(script), "    ")
    done = subprocess.run(
        [sys.executable, "-c", program, str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV,
    )
    assert done.returncode == 0, done.stderr


@contextmanager
def feed(
    url: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None
) -> Iterator[Iterator[ServerSentEvent]]:
    """The change feed's events (pings left out); the connection closes afterwards."""
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        connect_sse(
            client, "GET", url + "api/events", params=params or {}, headers=headers or {}
        ) as source,
    ):
        source.response.raise_for_status()
        # A ping (a comment) ends as an empty "message": the decoder keeps the last id.
        yield (sse for sse in source.iter_sse() if sse.event != "message" or sse.data)


def take(events: Iterator[ServerSentEvent], count: int, timeout: float = 20.0) -> list[Any]:
    """The next ``count`` events (``.event``, ``.id``, ``.json()``)."""
    taken: list[Any] = []
    deadline = time.monotonic() + timeout
    for event in events:
        taken.append(event)
        if len(taken) == count:
            return taken
        if time.monotonic() > deadline:
            break
    pytest.fail(f"{len(taken)} of {count} events within {timeout} s: {taken}")
