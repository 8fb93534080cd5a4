"""Derived values kept current by other processes' commits (SPEC §15): found in the
change log by this process's follower, which reads the scopes read only."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import reactor

PATIENCE = 30.0

WRITER = textwrap.dedent(
    """
    import random, sys, reactor

    db, rounds, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with reactor.open(db) as state:
        noise = state.scope("noise")
        for n in range(rounds):
            noise.set(f"n{n % 50}", n)  # read by nothing
            a, b = rng.sample(range(10), 2)
            moved = rng.randint(1, 30)
            while True:  # the other writer's transaction may come between: again
                try:
                    with state.transaction("ledger") as tx:
                        scope = tx["ledger"]
                        scope.set(f"a{a}", {"amount": scope.get(f"a{a}")["amount"] - moved})
                        scope.set(f"a{b}", {"amount": scope.get(f"a{b}")["amount"] + moved})
                    break
                except reactor.ConflictError:
                    continue
        state.scope("ledger").set(f"done{seed}", True)
    """
)


def _writer(db: Any, rounds: int, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), str(rounds), str(seed)],
        stderr=subprocess.PIPE,
        text=True,
    )


def test_other_processes_transactions_keep_it_current_and_never_half_seen(
    db_path: Path,
) -> None:
    """Two processes move amounts between keys in transactions (and write a scope
    nothing reads): every value published here of the total, computed or kept up, is
    the constant sum; the writes read by nothing compute nothing."""
    with reactor.open(db_path) as state:
        ledger = state.scope("ledger")
        for n in range(10):
            ledger.set(f"a{n}", {"amount": 100})
        computed = state.derive(
            lambda r: sum(v["amount"] for v in r.scope("ledger").values("a*")), name="total"
        )
        kept_up = state.sum("ledger", "a*", path="/amount")
        done = state.derive(lambda r: r.scope("ledger").keys("done*"), name="done")
        seen: list[int] = []
        computed.subscribe(lambda d: seen.append(d.value))
        kept_up.subscribe(lambda d: seen.append(d.value))
        writers = [_writer(db_path, 300, seed) for seed in (1, 2)]
        for writer in writers:
            _, err = writer.communicate(timeout=120)
            assert writer.returncode == 0, err
        done.wait_for(lambda writers: len(writers) == 2, timeout=PATIENCE)
        ledger.set("a0", {"amount": ledger.get("a0")["amount"] + 50})  # both publish it
        computed.wait_for(lambda total: total == 1050, timeout=PATIENCE)
        kept_up.wait_for(lambda total: total == 1050, timeout=PATIENCE)
        time.sleep(0.3)
        assert seen == [1050, 1050]
        assert kept_up.recomputations == 1  # built once, kept up from 1,200 changes
        # 600 transactions and the final write touch it: folded, far fewer runs.
        assert 1 < computed.recomputations <= 602
        assert state.stats()["events"]["published"] < 2000  # the noise was not read


def test_a_count_here_follows_another_processes_writes(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        new = state.count("orders", "o-*", where=lambda v: v["status"] == "new")
        script = textwrap.dedent(
            """
            import sys, reactor
            with reactor.open(sys.argv[1]) as state:
                orders = state.scope("orders")
                for n in range(100):
                    orders.set(f"o-{n}", {"status": "new"})
                for n in range(0, 100, 2):
                    orders.set(f"o-{n}", {"status": "shipped"})
                orders.delete("o-1")
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(db_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert new.wait_for(lambda n: n == 49, timeout=PATIENCE) == 49
