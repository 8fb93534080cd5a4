"""Every program in examples/ runs to completion and prints what shows it worked (the
docs include them as they are)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))
TIMEOUT = 60  # seconds per run; each example takes a few at most

# What each example must print: lines (or parts of lines) that only a working run prints,
# the same in every run (fencing tokens, revisions and timings vary: they are left out).
EXPECTED: dict[str, list[str]] = {
    "asyncio_service": [
        "job-6  done",
        "results: {'job-1': 1, 'job-2': 4, 'job-3': 9, 'job-4': 16, 'job-5': 25, 'job-6': 36}",
        "'jobs_done': 6",
    ],
    "bank_transfer": [
        "carol -> alice 1000: refused (carol holds 200)",
        "totals seen by the auditor's snapshots: [1000]",
    ],
    "typed_invoices": [
        "stored as: {'item': 'travel', 'quantity': 1, 'unit_price': '45.10'}",
        "due as stored: 2026-12-02T17:00:00Z",
        "read back equal: True",
        "total: 405.10 Decimal",
        "paid seen by the subscriber: True 405.10",
        "refused: TypeMismatchError",
        "strict handle refused a dataclass; keys: ['broken', 'inv-1']",
    ],
    "order_board": [
        "board: new 1, paid 2, shipped 0, revenue 75",
        "board: new 1, paid 0, shipped 2, revenue 75",
        "gate b-1: True",
        "inv-b-1: invoice for b-1",
        "times each count was built from the orders: [1, 1, 1]",
    ],
    "order_saga": [
        "o-1: {'status': 'shipped', 'charge': 'ch-o-1-30'}",
        "o-2: {'status': 'rejected', 'refund': 'refunded ch-o-2-45'}",
        "o-3: {'status': 'no approval in time', 'refund': 'refunded ch-o-3-12'}",
        "stock: widget 9",
        "shipments: ['o-1']",
        "o-3 steps: transaction, charge, receive:approval, refund, transaction",
    ],
    "circuit_breaker": [
        "search   200 OK",
        "timers: [('payments', None)]",
        "refused: open until its timer half-opens it",
        "ALERT payments: open after 3 failures",
        "note  payments: cooldown over, half-open (timer)",
        "ALERT payments: open after 4 failures",
        "payments 200 OK                                 -> closed",
        "timers fired: 2",
    ],
    "deploy_pipeline": [
        "queued v1.3.0 (the same job: it was queued already)",
        # Which worker gets the lock first varies: it deploys v1.2.3 or v1.3.0 first.
        " over v0.0.0",
        "v1.4.0 failed (health check failed), attempt 3",
        "the target refused its deployment: token",
        "release: LockNotOwnedError, the lease had expired",
        "last deployed: v1.3.2",
        "dead letters: [('v1.4.0', 3)]",
    ],
    "webhook_sender": [
        "first taken: {'event': 'refund', 'urgent': True}",  # priority 10
        "profile calls: [{'event': 'profile.changed', 'version': 4}]",  # 5 puts debounced
        "delivered: 14",
        "dead letters: 6, of ['acme']",
        "attempts of the first: [1, 2, 3]",
        "why: ConnectionError: HTTP 503 from https://acme.example/hook",
        "per customer: at most 1 at once (limit 1)",
        "takes of 32 (limit 20)",
    ],
    "upkeep_service": [
        "the session expired, with its event: True",
        "the reminder fired: 'send now'",
        "digests put while no app ran: at least 3: True",
        "the dead worker's job is back: ready, attempt 1",
        "why: the lease ran out",
        "health: ok",
        "the service stopped: exit 0, stopped",
    ],
    "global_counter": ["8 threads x 250: done = 2000", "+ 2 processes x 250: done = 2500"],
    "nightly_report": [
        "scheduled '30 6 * * MON-FRI' in Europe/Paris: first at Fri 2026-03-27 06:30 +0100",
        "Mon 2026-03-30 06:31 +0200  upkeep fired 1",  # summer time: still 6:30 in Paris
        "  report for 2026-04-01 done",
        "Fri 2026-04-03 12:00 +0200  back after 2 missed mornings: fired 1",
        "next: Mon 2026-04-06 06:30 +0200",
        "reports: ['2026-03-27', '2026-03-30', '2026-03-31', '2026-04-01', '2026-04-03']",
    ],
    "order_fulfilment": [
        "timers: ['o-1', 'o-2', 'o-3']",
        "o-1 paid: True | o-3 paid: True",
        "email  attempt 3: o-3 paid failed (550 no such mailbox)",
        "o-3 approved by manager",
        "timer  o-2: awaiting payment -> cancelled",
        "o-2: cancelled",
        "sent: ['ada@example.com: o-1 paid', 'bob@example.com: o-2 cancelled']",
        "dead letters: [('o-3 paid', 3)]",
        (
            "queue: {'ready': 0, 'delayed': 0, 'taken': 0, 'dead': 1, 'taken_by_group': {}, "
            "'rate_window': 0}"
        ),
    ],
    "order_updates": [
        "error:  op 1 type_mismatch",
        "error:  op 1 path_not_found",
        "error:  op 0 test_failed",
        "'tags': ['fragile', 'express']}",
    ],
    "order_workflow": [
        "o-5: shipped    42.00  new -> paid -> packed -> shipped",
        "'orders_paid': 5",
        "'revenue': 457.49",
        "'failed': 0",
    ],
    "quickstart": [
        "get o-1: {'total': 120, 'status': 'new'}",
        "o-1 new -> paid: True",
        "session after 0.25 s: None",
    ],
    "rate_limiter": [
        "t=0.0s  alice: 7 requests, 5 allowed, 2 refused",
        "t=0.6s  alice: 2 requests, 0 allowed, 2 refused",
        "carol: 8 threads x 10 requests, 5 allowed",
        "t=1.0s  counts: {}",
        "t=1.0s  alice: 7 requests, 5 allowed, 2 refused",
    ],
    "ttl_cache": [
        "t=30s  hit  {'USD': 1.08, 'fetch': 1}",
        "t=60s  exists: False, ttl: -2.0",
        "fetched 2 times",
    ],
}
# The examples that take a database path as their argument (the others make their own).
TAKE_A_PATH = sorted(
    path for path in EXAMPLES if "if len(sys.argv) > 1:" in path.read_text(encoding="utf-8")
)


def run_example(example: Path, cwd: Path, *args: str) -> str:
    """Run ``example`` in a fresh interpreter, warnings as errors; return its output."""
    done = subprocess.run(
        [sys.executable, "-W", "error", str(example), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Nothing on stderr: no traceback, and no error logged by reactor (a subscriber
    # that raised is logged there, without failing the program).
    assert done.stderr == ""
    return done.stdout


def test_every_example_has_expectations() -> None:
    assert EXAMPLES
    assert sorted(EXPECTED) == [path.stem for path in EXAMPLES]


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    output = run_example(example, tmp_path)
    for expected in EXPECTED.get(example.stem, []):
        assert expected in output


@pytest.mark.timeout(2 * TIMEOUT + 30)
@pytest.mark.parametrize("example", TAKE_A_PATH, ids=[path.stem for path in TAKE_A_PATH])
def test_example_runs_twice_on_one_file(example: Path, tmp_path: Path) -> None:
    """Run on a file given as argument, twice: the second run starts afresh and works."""
    database = tmp_path / "data" / "state.db"
    run_example(example, tmp_path, str(database))
    assert database.exists()
    output = run_example(example, tmp_path, str(database))
    for expected in EXPECTED.get(example.stem, []):
        assert expected in output
