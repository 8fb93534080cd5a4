"""A rate limiter: at most LIMIT requests per client and per one-second window.

    python examples/rate_limiter.py            # a database in a temporary folder
    python examples/rate_limiter.py state.db   # that file

Windows are fixed: window n covers [n, n + 1) seconds. A request of a client in window
n increments the key "CLIENT:n" of the scope "rate"; the first one gives the key a TTL
that ends with its window, so the counts of past windows delete themselves. The
increment is atomic, so threads, and processes sharing the database, let exactly LIMIT
requests through per window between them.

The clock is injected (``reactor.open(..., clock=...)``), so the example moves to the
next window at once instead of sleeping. With the real clock the code is the same.
"""

from __future__ import annotations

import math
import sys
import tempfile
import threading
from pathlib import Path

import reactor
from reactor.testing import ManualClock

LIMIT = 5  # requests per window
WINDOW = 1.0  # seconds


def allow(rate: reactor.Scope, clock: reactor.Clock, client: str) -> bool:
    """Count a request of ``client``; return whether it is within the limit."""
    now = clock.time()
    window = math.floor(now / WINDOW)
    key = f"{client}:{window}"
    count = rate.increment(key)  # atomic; refused requests count too, as with Redis INCR
    if count == 1:
        # The window's first request makes the key end with the window. Were the process
        # to die just before this line, the key would stay without expiry, harmlessly:
        # it names a window that is never counted again.
        rate.expire(key, (window + 1) * WINDOW - now)
    return count <= LIMIT


def burst(rate: reactor.Scope, clock: reactor.Clock, client: str, requests: int) -> str:
    allowed = sum(allow(rate, clock, client) for _ in range(requests))
    return f"{client}: {requests} requests, {allowed} allowed, {requests - allowed} refused"


def run(path: Path) -> None:
    clock = ManualClock()
    with reactor.open(path, clock=clock) as state:
        rate = state.scope("rate")
        rate.clear()  # start afresh when the same file is used twice

        print("t=0.0s ", burst(rate, clock, "alice", 7))
        print("t=0.0s ", burst(rate, clock, "bob", 2))  # each client has its own count
        clock.advance(0.6)
        print("t=0.6s ", burst(rate, clock, "alice", 2))  # the same window: still over

        # 8 threads at once, 10 requests each: still exactly LIMIT get through.
        allowed: list[bool] = []

        def client() -> None:
            allowed.extend(allow(rate, clock, "carol") for _ in range(10))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"t=0.6s  carol: 8 threads x 10 requests, {sum(allowed)} allowed")
        assert sum(allowed) == LIMIT
        for key, count in rate.list().items():
            print(f"t=0.6s  {key} = {count}, expires in {rate.ttl(key):.1f} s")

        clock.advance(0.4)  # t=1.0s: a new window; the counts of the last one expired
        print("t=1.0s  counts:", rate.list())
        assert rate.list() == {}
        print("t=1.0s ", burst(rate, clock, "alice", 7))


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
