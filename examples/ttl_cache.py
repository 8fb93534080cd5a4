"""A cache with a time to live, tested with a manual clock: no sleeping.

    python examples/ttl_cache.py

``reactor.open(..., clock=...)`` takes any object with ``time()`` returning epoch
seconds; ``reactor.testing.ManualClock`` is one that moves only when told to.
Deadlines, reads and the expiry sweeper all use it, so moving the clock forward expires
keys at once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import reactor
from reactor.testing import ManualClock


def get_cached(
    cache: reactor.Scope, key: str, fetch: Callable[[], Any], ttl: float
) -> tuple[Any, bool]:
    """The cached value of ``key``, or ``fetch()`` stored for ``ttl`` seconds.

    Returns the value and whether it came from the cache.
    """
    # MISSING as the default tells "absent" apart from a cached None.
    value = cache.get(key, reactor.MISSING)
    if value is not reactor.MISSING:
        return value, True
    value = fetch()
    cache.set(key, value, ttl=ttl)
    return value, False


def main() -> None:
    clock = ManualClock()
    fetches = 0

    def fetch_rates() -> dict[str, Any]:
        """The slow call the cache saves: it says which fetch produced the value."""
        nonlocal fetches
        fetches += 1
        return {"USD": 1.08, "fetch": fetches}

    with (
        tempfile.TemporaryDirectory() as folder,
        reactor.open(Path(folder) / "cache.db", clock=clock) as state,
    ):
        cache = state.scope("cache")

        value, hit = get_cached(cache, "rates", fetch_rates, ttl=60)
        print(f"t=0s   {'hit ' if hit else 'miss'} {value}")
        assert not hit

        clock.advance(30)
        value, hit = get_cached(cache, "rates", fetch_rates, ttl=60)
        print(f"t=30s  {'hit ' if hit else 'miss'} {value}  ttl left: {cache.ttl('rates')} s")
        assert hit

        clock.advance(30)  # t=60s: the deadline; the key is absent from now on
        print(f"t=60s  exists: {cache.exists('rates')}, ttl: {cache.ttl('rates')}")
        value, hit = get_cached(cache, "rates", fetch_rates, ttl=60)
        print(f"t=60s  {'hit ' if hit else 'miss'} {value}")
        assert not hit

        print(f"fetched {fetches} times")
        assert fetches == 2


if __name__ == "__main__":
    main()
