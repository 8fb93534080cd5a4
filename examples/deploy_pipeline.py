"""A deployment pipeline as a work queue: releases queued, deployed one at a time,
retried when the target fails, dead-lettered when they never work.

    python examples/deploy_pipeline.py            # a database in a temporary folder
    python examples/deploy_pipeline.py state.db   # that file

CI puts each release in the queue "releases", with the version as its idempotency key:
a CI job retried after a timeout puts the same release again, and it is queued once.
Two deploy workers (threads here; processes sharing the file work the same way) take
releases in order, each leased to one worker. The lock "deployment_lock" lets one
deploy at a time; inside it, a worker checks the last deployed version, records the
status, deploys, and pushes an entry to the history list, then acknowledges the job.
A deployment that fails goes back to the queue for another try; a release that fails
every try ends in the dead letters. The deployment target checks the lock's fencing
token, so a worker whose lease ran out while it was stalled cannot deploy over a newer
holder.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import reactor

LOCK = "deployment_lock"
RELEASES = ["v1.2.3", "v1.3.0", "v1.3.0", "v1.3.1", "v1.4.0"]  # v1.3.0 put twice
BROKEN = "v1.4.0"  # a release whose deployment never works
MAX_ATTEMPTS = 3
DEPLOY_SECONDS = 0.15  # how long the pretend deployment takes

_start = time.monotonic()
_print_lock = threading.Lock()


def say(worker: str, message: str) -> None:
    with _print_lock:
        print(f"{time.monotonic() - _start:5.2f}s  {worker:5} {message}")


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


class StaleTokenError(Exception):
    """The target refused a deployment made with an older fencing token."""


class DeployTarget:
    """The system deployed to. It remembers the highest fencing token it has seen and
    refuses any request carrying an older one: that is what makes tokens useful."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.highest_token = 0
        self.version: str | None = None
        self.running = 0  # deployments in progress, to show there is never more than one
        self.most_running = 0

    def begin(self) -> None:
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)

    def end(self) -> None:
        with self._lock:
            self.running -= 1

    def install(self, version: str, token: int) -> None:
        with self._lock:
            if token < self.highest_token:
                raise StaleTokenError(f"token {token} < {self.highest_token}: refused")
            self.highest_token = token
            if version == BROKEN:
                raise RuntimeError("health check failed")
            self.version = version


def deploy(state: reactor.State, target: DeployTarget, worker: str, version: str) -> bool:
    """Deploy ``version`` unless it (or a newer one) is already out; return whether it did.

    Raises:
        RuntimeError: the deployment failed (the target's health check).
    """
    deploys = state.scope("deploys")
    # A cheap check first: most of the time another worker already did the job.
    if version_key(deploys.get("last_deployed_version", "v0.0.0")) >= version_key(version):
        say(worker, f"{version} already deployed, nothing to do")
        return False

    say(worker, f"waits for {LOCK}")
    # ttl: the lease ends by itself if this worker dies; timeout: LockTimeout after 10 s.
    with state.lock(LOCK, ttl=5, timeout=10) as lock:
        token = lock.token
        assert token is not None
        # Check again under the lock: the other worker may have deployed meanwhile.
        last = deploys.get("last_deployed_version", "v0.0.0")
        if version_key(last) >= version_key(version):
            say(worker, f"has the lock (token {token}): {last} is out already, skipping")
            return False
        say(worker, f"has the lock (token {token}): deploying {version} over {last}")
        deploys.set("deploy_status", "in_progress")
        deploys.set("deploy_start_time", time.time())
        deploys.increment("total_deploys")

        started = time.monotonic()
        target.begin()
        try:
            time.sleep(DEPLOY_SECONDS)
            target.install(version, token)  # the target sees the token with every request
        except RuntimeError:
            deploys.set("deploy_status", "failed")
            raise
        finally:
            target.end()

        deploys.set("last_deployed_version", version)
        deploys.set("deploy_status", "completed")
        deploys.set("deploy_end_time", time.time())
        deploys.push(
            "deploy_history",
            {
                "version": version,
                "worker": worker,
                "token": token,
                "duration": round(time.monotonic() - started, 3),
            },
        )
        say(worker, f"deployed {version}, releases the lock")
    return True


def worker_loop(state: reactor.State, target: DeployTarget, worker: str) -> None:
    """Take releases until the queue has none left (ready, delayed or taken)."""
    releases = state.queue("releases", max_attempts=MAX_ATTEMPTS)
    while True:
        job = releases.take(timeout=0.1, lease=10)
        if job is None:
            counts = releases.stats()
            if counts["ready"] + counts["delayed"] + counts["taken"] == 0:
                return
            continue
        try:
            deploy(state, target, worker, job.item["version"])
        except RuntimeError as exc:
            say(worker, f"{job.item['version']} failed ({exc}), attempt {job.attempts}")
            job.nack(delay=0.05)  # back to the queue; dead after MAX_ATTEMPTS tries
        else:
            job.ack()


def stale_holder(state: reactor.State, target: DeployTarget) -> None:
    """A holder whose lease expires while it is stalled is fenced off by its token."""
    slow = state.lock(LOCK, ttl=0.2)
    slow.acquire()
    token = slow.token
    assert token is not None
    say("slow", f"has the lock (token {token}), then stalls past its 0.2 s lease")
    time.sleep(0.3)  # a long GC pause, a suspended VM, a slow disk...

    deploy(state, target, "ci-3", "v1.3.2")  # the lease expired: ci-3 gets the lock

    try:
        target.install("v1.2.9", token)  # the stalled worker wakes up and carries on
    except StaleTokenError as exc:
        say("slow", f"the target refused its deployment: {exc}")
    try:
        slow.release()
    except reactor.LockNotOwnedError:
        say("slow", "release: LockNotOwnedError, the lease had expired")


def run(path: Path) -> None:
    with reactor.open(path) as state:
        deploys = state.scope("deploys")
        deploys.clear()  # start afresh when the same file is used twice
        releases = state.queue("releases", max_attempts=MAX_ATTEMPTS)
        releases.retry_dead()
        while (job := releases.take(timeout=0)) is not None:
            job.ack()
        target = DeployTarget()

        queued: set[int] = set()
        for version in RELEASES:  # CI, release after release (and one retried)
            job_id = releases.put({"version": version}, key=version)
            again = " (the same job: it was queued already)" if job_id in queued else ""
            queued.add(job_id)
            say("ci", f"queued {version}{again}")

        workers = [
            threading.Thread(target=worker_loop, args=(state, target, name))
            for name in ("ci-1", "ci-2")
        ]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        assert target.most_running == 1, "two deployments ran at once"

        stale_holder(state, target)

        print("last deployed:", deploys.get("last_deployed_version"))
        print("status:", deploys.get("deploy_status"), "| deploys:", deploys.get("total_deploys"))
        for entry in deploys.get("deploy_history"):
            print("history:", entry)
        dead = [(job.item["version"], job.attempts) for job in releases.dead()]
        print("dead letters:", dead)
        assert dead == [(BROKEN, MAX_ATTEMPTS)]
        assert target.version == "v1.3.2"


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
