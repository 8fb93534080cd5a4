"""Periodic jobs (``Queue.put_every``): a timer of the queue's scope, ``queue:NAME``,
whose firing puts a job instead of writing a key (``timers._apply``).

The firing is the timer's: exactly once per due time, by one process, in the
transaction that moves the timer to its next period, and once after missed periods
(no flood). The job is put in that transaction too, so a firing that commits has put
its job and one that fails has put none. A schedule is named by its key: its timer's
id is derived from the queue and the key, so every process that declares it at
start-up declares the same one, and a declaration identical to the stored one leaves
it be (its next firing stays when it was).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from reactor._base.keys import check_key
from reactor._base.results import Timer
from reactor._storage.txn import Work
from reactor.errors import InvalidArgumentError

from . import timers as _timers
from .jobs import check_queue, lock_name

if TYPE_CHECKING:
    from reactor._engine.options import Options

__all__ = ["put_every", "schedule_id"]


def schedule_id(queue: str, key: str) -> str:
    """The id of the timer of queue ``queue``'s schedule ``key``."""
    digest = hashlib.sha256(f"{queue}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()
    return "every-" + digest[:32]


def put_every(
    options: Options, queue: str, item: Any, key: object, every: object, cron: object, tz: object
) -> Work[Timer]:
    """The work that declares schedule ``key`` of ``queue``: a job of ``item`` every
    ``every`` seconds, or at the times of ``cron`` in zone ``tz``.

    Raises:
        InvalidKeyError: a bad queue name or key.
        InvalidArgumentError: neither or both of ``every`` and ``cron``, or a bad one.
        InvalidValueError: ``item`` is not storable.
    """
    name = check_queue(queue)
    checked = check_key(key, "schedule key")
    if (every is None) == (cron is None):
        raise InvalidArgumentError("put_every needs every= seconds or cron=, one of them")
    return _timers.schedule(
        options,
        lock_name(name),
        checked,
        item,
        None,
        None,
        None,
        every,
        cron=cron,
        tz=tz,
        timer_id=schedule_id(name, checked),
        keep_same=True,
    )
