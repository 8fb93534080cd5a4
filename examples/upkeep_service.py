"""A deployment's shape: programs that write and leave, and `reactor serve` keeping the
database's upkeep between them (keys expire with their events, timers fire, periodic
jobs are put, the jobs of a worker that died come back).

    python examples/upkeep_service.py            # a database in a temporary folder
    python examples/upkeep_service.py state.db   # that file

The app opens the database with a long `sweep_interval`: it leaves the upkeep to
`reactor serve`, started here as a subprocess with health checks (as systemd or a
container would start it). The app sets a session that expires, schedules a reminder,
declares a periodic digest job, and a worker takes a job and dies without acking it.
Then no program of ours runs for a second: the service does what comes due. A
read-only look afterwards sees it done; the health endpoint says ok; SIGTERM stops the
service cleanly.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import reactor

QUIET = 3600.0  # the app's sweep interval: it leaves the upkeep to the service


def start_service(path: str) -> tuple[subprocess.Popen[str], str]:
    """``reactor serve`` on ``path``, with health checks on a free port; the process
    and its health URL (read off its first log line)."""
    command = [sys.executable, "-m", "reactor", "--db", path, "serve"]
    service = subprocess.Popen(  # noqa: S603 - this Python, reactor's own command
        [*command, "--interval", "0.05", "--health", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert service.stderr is not None
    first = service.stderr.readline()  # "... serving PATH (pid N): ...; health at URL"
    found = re.search(r"health at (\S+)", first)
    if found is None:
        service.kill()
        raise SystemExit(f"reactor serve did not start: {first}{service.stderr.read()}")
    return service, found[1]


def main(path: str) -> None:
    with reactor.open(path, sweep_interval=QUIET) as app:  # creates the database
        digests = app.queue("digests", max_attempts=3)
        digests.purge()  # a second run on the same file starts afresh
        for timer in app.timers():
            app.cancel_timer(timer.id)
    service, health = start_service(path)
    try:
        with reactor.open(path, sweep_interval=QUIET) as app:
            since = app.stats()["revision"]
            app.scope("sessions").set("s-1", {"user": "ada"}, ttl=0.3)
            app.scope("reminders").schedule("invoice-42", "send now", after=0.3)
            digests = app.queue("digests")
            digests.put_every({"kind": "digest"}, key="digest", every=0.25)
            digests.put({"kind": "report"})
            taken = digests.take(timeout=1, lease=0.3)  # a worker that dies with it
            assert taken is not None
        time.sleep(1.2)  # no program of ours runs: the service keeps the upkeep
        with reactor.open(path, readonly=True) as reader:
            changes = reader.changes(since)
            expired = [event.key for event in changes if event.type == "expired"]
            print(f"the session expired, with its event: {expired == ['s-1']}")
            print(f"the reminder fired: {reader.scope('reminders').get('invoice-42')!r}")
            periodic = [
                event
                for event in changes
                if event.scope == "queue:digests"
                and event.type == "created"
                and event.new_value["item"] == {"kind": "digest"}
            ]
            print(f"digests put while no app ran: at least 3: {len(periodic) >= 3}")
            report = reader.queue("digests").job(taken.id)
            assert report is not None
            print(f"the dead worker's job is back: {report.state}, attempt {report.attempts}")
            print(f"why: {report.errors[-1]['error'].splitlines()[0]}")
        with urllib.request.urlopen(health, timeout=10) as answer:  # noqa: S310 - loopback
            print(f"health: {json.loads(answer.read())['status']}")
        with reactor.open(path, sweep_interval=QUIET) as app:
            for timer in app.timers():  # the digests stop with the example
                app.cancel_timer(timer.id)
    finally:
        service.send_signal(signal.SIGTERM)
        _, log = service.communicate(timeout=30)
    print(f"the service stopped: exit {service.returncode}, {log.splitlines()[-1].split(': ')[-1]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(str(Path(folder) / "state.db"))
