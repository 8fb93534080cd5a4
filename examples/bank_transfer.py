"""Transfers between accounts in a transaction, and consistent snapshots of them.

    python examples/bank_transfer.py            # a database in a temporary folder
    python examples/bank_transfer.py state.db   # that file

A transfer takes the amount from one account and adds it to another in one
transaction: both writes commit together, or neither does. A transfer that would leave
the source account negative raises inside the body, and the transaction rolls back.
Meanwhile ``snapshot()`` reads every account at once, so the total it sees never
changes, however many transfers are running.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
from pathlib import Path

import reactor

ACCOUNTS = {"alice": 500, "bob": 300, "carol": 200}  # in cents
TOTAL = sum(ACCOUNTS.values())
THREADS = 4
TRANSFERS = 30  # per thread


class InsufficientFundsError(Exception):
    """The source account does not hold the amount."""


def transfer(accounts: reactor.Scope, source: str, target: str, amount: int) -> None:
    """Move ``amount`` from ``source`` to ``target``: both or neither.

    Raises:
        InsufficientFundsError: ``source`` holds less than ``amount``; nothing changed.
    """
    for attempt in range(3):
        try:
            with accounts.transaction() as tx:  # this scope is ours until the block ends
                balance = tx.decrement(source, by=amount)  # the body sees its own writes
                if balance < 0:
                    # Raising rolls back the whole transaction, the decrement included.
                    raise InsufficientFundsError(f"{source} holds {balance + amount}")
                tx.increment(target, by=amount)
                tx.push("ledger", {"from": source, "to": target, "amount": amount})
            return
        except reactor.ConflictError:
            # Another process wrote to "accounts" during the body; nothing was applied.
            if attempt == 2:
                raise


def balances(snapshot: reactor.Snapshot) -> dict[str, int]:
    return {name: snapshot.values[name] for name in ACCOUNTS}


def random_transfers(accounts: reactor.Scope, seed: int, refused: list[int]) -> None:
    rng = random.Random(seed)
    for _ in range(TRANSFERS):
        source, target = rng.sample(sorted(ACCOUNTS), 2)
        try:
            transfer(accounts, source, target, rng.randint(1, 150))
        except InsufficientFundsError:
            refused.append(1)


def run(path: Path) -> None:
    with reactor.open(path) as state:
        accounts = state.scope("accounts")
        accounts.clear()  # start afresh when the same file is used twice
        accounts.set_many(ACCOUNTS)

        transfer(accounts, "alice", "bob", 120)
        print("alice -> bob 120:", balances(accounts.snapshot()))

        try:
            transfer(accounts, "carol", "alice", 1_000)
        except InsufficientFundsError as exc:
            print(f"carol -> alice 1000: refused ({exc}):", balances(accounts.snapshot()))
        assert accounts.get("carol") == 200
        assert accounts.length("ledger") == 1

        # Transfers from several threads, while another thread takes snapshots.
        refused: list[int] = []
        totals: set[int] = set()
        done = threading.Event()

        def audit() -> None:
            while not done.is_set():
                totals.add(sum(balances(accounts.snapshot()).values()))

        auditor = threading.Thread(target=audit)
        auditor.start()
        workers = [
            threading.Thread(target=random_transfers, args=(accounts, seed, refused))
            for seed in range(THREADS)
        ]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        done.set()
        auditor.join()

        snapshot = accounts.snapshot()  # every key, read at once, and its revision
        applied = len(snapshot.values["ledger"])
        attempted = THREADS * TRANSFERS
        print(f"{attempted} random transfers: {applied - 1} applied, {len(refused)} refused")
        print(f"at revision {snapshot.revision}:", balances(snapshot))
        print("totals seen by the auditor's snapshots:", sorted(totals))
        assert totals == {TOTAL}
        assert sum(balances(snapshot).values()) == TOTAL
        assert applied - 1 + len(refused) == attempted
        assert all(balance >= 0 for balance in balances(snapshot).values())


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
