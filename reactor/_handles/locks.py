"""``Lock``: a named lease in the database, held across threads and processes.

A lease lives in ``reactor_locks``: its holder, its deadline and a fencing token that
grows by one at every acquisition of the name (a released lock keeps its row, so the
count never restarts). Taking, renewing and giving back a lease are short write
transactions. A waiter stands in the engine's line for the name (``lock_lines``): woken
at once by a release in this process, it looks again at least every 50 ms for releases
and expiries elsewhere; waiting never spins the CPU.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from reactor._base.checks import check_timeout
from reactor._base.keys import check_key
from reactor._storage.records import LockRow
from reactor._storage.txn import WriteTxn
from reactor.errors import InvalidArgumentError, LockNotOwnedError, LockTimeout, ReentrancyError

from . import lock_lines
from .verbs import check_ttl

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .binding import Binding

__all__ = ["Lock", "check_lock"]

logger = logging.getLogger("reactor")


def check_lock(name: object, ttl: object, timeout: object) -> tuple[str, float, float | None]:
    """A lock's name, lease in seconds and wait in seconds (None: no limit).

    Raises:
        InvalidKeyError: a bad name.
        InvalidArgumentError: no ttl > 0, or a timeout not None nor a number >= 0.
    """
    checked = check_key(name, "lock name")
    seconds = check_ttl(ttl)
    if seconds is None:
        raise InvalidArgumentError("a lock needs a ttl: a number of seconds > 0")
    return checked, seconds, check_timeout(timeout)


class Lock:
    """A lease on ``name`` for ``ttl`` seconds; take it with ``state.lock(name, ttl)``.

    Not re-entrant. ``with state.lock(name, ttl=30, timeout=60):`` acquires (raising
    ``LockTimeout`` if it cannot within ``timeout``) and releases on exit.
    """

    def __init__(
        self, binding: Binding, name: str, ttl: float, timeout: float | None = None
    ) -> None:
        self._binding = binding
        self.name, self.ttl, self.timeout = check_lock(name, ttl, timeout)
        self._owner = uuid.uuid4().hex
        self._held = False
        self.token: int | None = None
        """The fencing token of this holder's lease; None when it holds none (before
        acquiring, after releasing, after an acquire that failed)."""

    def __repr__(self) -> str:
        return f"<reactor.Lock {self.name!r} token={self.token}>"

    @property
    def _engine(self) -> EnginePort:
        return self._binding.engine

    def _try(self) -> int | None:
        name, owner, ttl = self.name, self._owner, self.ttl

        def work(txn: WriteTxn) -> int | None:
            row = txn.statements.fetch_lock(name)
            if row is not None and row.held(txn.now):
                return None
            token = (row.token if row is not None else 0) + 1
            txn.writes.save_lock(name, LockRow(owner, token, txn.now + ttl))
            return token

        engine = self._engine
        token = engine.commit(work)
        return token

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lease; return whether it was taken.

        ``blocking=False`` tries once. Otherwise wait up to ``timeout`` seconds (None:
        until it is free, or the engine closes).

        Raises:
            ReentrancyError: this holder already holds it (a lock is not re-entrant).
            ClosedError: the engine closed.
        """
        if self._held and self.held():
            raise ReentrancyError(f"lock {self.name!r} is already held by this holder")
        seconds = check_timeout(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        token = self._try()
        if token is None and blocking:
            token = self._wait(deadline)
        self.token, self._held = token, token is not None
        if token is not None:
            self._engine.stats.count("locks_acquired")
        return token is not None

    def _wait(self, deadline: float | None) -> int | None:
        """Try again in this engine's line of waiters until taken (the token) or out of
        time (None)."""
        line = self.line()
        try:
            since, pause = line.wakes, lock_lines.POLL_MIN
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                woken = line.wait(since, pause if left is None else min(pause, left))
                pause = lock_lines.next_pause(pause, woken)
                since = line.wakes
                token = self._try()  # raises ClosedError once the engine closed
                if token is not None:
                    return token
        finally:
            line.leave()

    def line(self) -> lock_lines.LockLine:
        """Stand in this engine's line of waiters for the name (``leave`` it after).

        Raises:
            ClosedError: the engine is closed.
        """
        return lock_lines.join(self._engine.hub, self.name)

    def _own(self, txn: WriteTxn) -> LockRow:
        row = txn.statements.fetch_lock(self.name)
        if row is None or row.owner != self._owner or not row.held(txn.now):
            raise LockNotOwnedError(
                f"lock {self.name!r} is not held by this holder (it expired, or was never taken)"
            )
        return row

    def release(self) -> None:
        """Give the lease back.

        Raises:
            LockNotOwnedError: it is not held by this holder (expired, or someone else's).
        """

        def work(txn: WriteTxn) -> None:
            row = self._own(txn)
            txn.writes.save_lock(self.name, LockRow(None, row.token, None))

        engine = self._engine
        try:
            engine.commit(work)
        except LockNotOwnedError:
            self._held, self.token = False, None
            raise
        self._held, self.token = False, None
        lock_lines.wake(engine.hub, self.name)

    def extend(self, ttl: float | None = None) -> None:
        """Renew the lease for ``ttl`` seconds from now (the lock's ``ttl`` by default).

        Raises:
            LockNotOwnedError: it is not held by this holder.
        """
        seconds = check_ttl(ttl) or self.ttl

        def work(txn: WriteTxn) -> None:
            row = self._own(txn)
            txn.writes.save_lock(self.name, LockRow(row.owner, row.token, txn.now + seconds))

        engine = self._engine
        engine.commit(work)

    def held(self) -> bool:
        """Whether this holder holds the lease now."""
        engine = self._engine
        row = engine.store.reader().fetch_lock(self.name)
        return row is not None and row.owner == self._owner and row.held(engine.now())

    def __enter__(self) -> Lock:
        if not self.acquire(timeout=self.timeout):
            raise LockTimeout(f"lock {self.name!r} was not acquired within {self.timeout} s")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            self.release()
        except LockNotOwnedError:
            if exc_type is None:
                raise  # the body ran without the lease it thought it had: say so
            logger.warning("lock %r had expired when its body raised", self.name)
