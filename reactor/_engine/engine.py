"""``Engine``: the shared state of one database in this process, behind every handle
``open()`` returns for it.

An engine owns the store, the scope actors (through their mailboxes), the dispatcher
that publishes commits to subscriptions and watches, the sweeper and the statistics.
The registry (``_registry``) shares it between handles and closes it with the last.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from reactor._base.results import Upkeep
from reactor._base.values import encode
from reactor._storage.locate import open_store
from reactor._storage.records import ChangeRecord
from reactor._storage.txn import Work, WriteTxn
from reactor.errors import ClosedError, OperationTimeout, ReadOnlyError

from .dispatch import Dispatcher
from .hub import Hub
from .mailbox import Mailbox, Reply, Request, shard_index
from .options import Options
from .reply import ThreadReply
from .stats import Stats, UpkeepProgress

if TYPE_CHECKING:  # imported when used: SQLAlchemy for PostgreSQL, asyncio by reactor.aio
    import asyncio

    import sqlalchemy as sa


__all__ = ["Background", "Engine", "operation_timeout"]

logger = logging.getLogger("reactor")
T = TypeVar("T")

FINISH_TIMEOUT: Final = 5.0  # seconds close() waits, in all, for subscribers to deliver
_OWNERS_KEPT: Final = 4096  # scopes whose mailbox is looked up by name, not by hash


def operation_timeout(scope: str, seconds: float, future: Reply) -> OperationTimeout:
    """The error for a request that got no answer in time; withdraws it if it can."""
    withdrawn = future.cancel()
    return OperationTimeout(
        f"scope {scope!r} did not answer within {seconds} s"
        + ("; the write was withdrawn" if withdrawn else "; it may still commit")
    )


class Background(Protocol):
    """The background upkeep (``_work.sweeper``), which the engine stops first when it
    closes."""

    def upkeep(self, held: Collection[str] = ()) -> Upkeep:
        """Run the chores once, now, and wait for them; what they did. ``held``: the
        scopes the caller's own transaction holds (``ReentrancyError`` if it needs
        one)."""
        ...

    def close(self, timeout: float) -> None:
        """Stop (waiting up to ``timeout`` seconds)."""
        ...

    def progress(self) -> UpkeepProgress:
        """How it is getting on."""
        ...


class Engine:
    """The shared state of one database in this process.

    ``on_close`` is called once, as ``close()`` begins (the registry forgets it then).
    """

    def __init__(
        self,
        key: str,
        location: Path | sa.URL | None,
        options: Options,
        on_close: Callable[[Engine], None],
    ) -> None:
        self.key = key
        self.options = options
        self.clock = options.clock
        # The clock's own method (the builtin time.time for the system clock): every
        # read and write asks the time, and a method of ours around it would cost a call.
        self.now: Callable[[], float] = options.clock.time
        self.stats = Stats()
        self.store = open_store(
            location,
            durability=options.durability,
            timeout=options.timeout,
            readonly=options.readonly,
        )
        self.closed = False
        self._on_close = on_close
        self._handles = 0
        self._lock = threading.Lock()
        self._mailboxes: list[Mailbox | None] = [None] * options.max_actors
        # scope -> its actor's mailbox, for the scopes written lately (a dict lookup
        # rather than the hash of the name on every write)
        self._owner: dict[str, Mailbox] = {}
        try:
            self.dispatcher = Dispatcher(key, self.store, self.stats, follow=location is not None)
        except BaseException:
            self.store.close()  # its connections are not left to the garbage collector
            raise
        self.hub = Hub(self.dispatcher)  # every listener of changes joins it
        # The background upkeep (``_work.sweeper``): started by whoever opens the engine
        # (not when read-only: everything it does writes); stopped first at close.
        self.sweeper: Background | None = None

    # -- time and values -----------------------------------------------------------
    def encode(self, value: Any) -> str:
        return encode(
            value, max_depth=self.options.max_depth, max_bytes=self.options.max_value_bytes
        )

    # -- writes: the one door --------------------------------------------------------
    # Nothing else calls the store's write or a mailbox: every commit goes through
    # here, and every commit's records are published (``publish``).
    def write(self, scope: str, work: Work[T]) -> T:
        """Run ``work`` on the actor that owns ``scope``; wait for its commit.

        Raises:
            OperationTimeout: no answer within the engine's timeout.
        """
        # _mailbox's cache inline (a write's path): its call only for a new scope.
        mailbox = self._owner.get(scope) or self._mailbox(scope)
        return mailbox.call(work, scope, lambda future: self.wait(scope, future))

    def submit(
        self,
        scope: str,
        work: Work[T],
        *,
        owner: object = None,
        scopes: tuple[str, ...] | None = None,
        alone: bool = False,
    ) -> ThreadReply[T]:
        """Queue ``work`` on the actor that owns ``scope``: its future holds the result
        after the commit (see ``Request`` for ``owner``, ``scopes``, ``alone``).

        Raises:
            ClosedError: the engine is closed.
        """
        future: ThreadReply[T] = ThreadReply()
        self._mailbox(scope).submit(Request(work, scope, owner, scopes, alone=alone, reply=future))
        return future

    def send(self, scope: str, work: Work[Any], reply: Reply) -> None:
        """Queue ``work`` on the actor that owns ``scope``, its outcome settled on
        ``reply`` after the commit: ``submit`` without a ``ThreadReply`` (an asyncio
        caller's answer wakes its loop).

        Raises:
            ClosedError: the engine is closed.
        """
        mailbox = self._owner.get(scope) or self._mailbox(scope)  # as in ``write``
        mailbox.submit(Request(work, scope, reply=reply))

    def hold(self, scope: str, owner: object) -> ThreadReply[None]:
        """Ask ``scope``'s actor to hold the scope for transaction ``owner``: the future
        is done once it does; ``release`` ends the hold.

        Raises:
            ClosedError: the engine is closed.
        """
        future: ThreadReply[None] = ThreadReply()
        self._mailbox(scope).submit(Request(None, scope, owner, reply=future))
        return future

    def release(self, scope: str, owner: object) -> None:
        """End ``owner``'s hold on ``scope`` (if it has it); what it deferred runs next."""
        self._mailbox(scope).release(scope, owner)

    def moved(self, scope: str) -> float | None:
        """When a transaction last took ``scope`` or gave it back (``Mailbox.moved``)."""
        mailbox = self._mailboxes[shard_index(scope, len(self._mailboxes))]
        return None if mailbox is None else mailbox.moved(scope)

    def commit(
        self,
        work: Callable[[WriteTxn], T],
        *,
        scopes: Collection[str] | None = None,
        reads: Collection[tuple[str, str]] = (),
        combine: bool = False,
    ) -> T:
        """Run ``work`` in a transaction of its own, in this thread, outside the scopes'
        actors (locks, queues, durable positions, upkeep, the import); publish what it
        changed. ``scopes``: the only scopes ``work`` reads or writes (None: any);
        ``reads``: the keys it reads, read ahead with the begin; ``combine``: it may
        share its transaction with other threads' (it is undone alone if it fails,
        see ``Combiner``).

        Raises:
            BusyError: the database (or this process's writer) stayed busy too long.
            StorageError: the database failed; nothing was committed.
        """
        result, _ = self.store.write(
            work, self.now(), self.publish, shared=combine, scopes=scopes, reads=reads
        )
        return result

    def upkeep_progress(self) -> UpkeepProgress | None:
        """How the background upkeep is getting on (None: read-only, there is none)."""
        return None if self.sweeper is None else self.sweeper.progress()

    def upkeep(self, held: Collection[str] = ()) -> Upkeep:
        """Run the sweeper's chores once, in this thread, and wait for them
        (``Sweeper.upkeep``); what they did. ``held``: the scopes the caller's own
        transaction holds.

        Raises:
            ReentrancyError: a chore needs a scope in ``held``.
            ReadOnlyError: the engine is read-only (it has no sweeper: every chore writes).
            ClosedError: the engine is closed.
            OperationTimeout: a scope's actor did not answer in time.
            StorageError: a chore's write failed.
        """
        if self.closed:
            raise ClosedError("the engine is closed")
        if self.sweeper is None:
            raise ReadOnlyError("a read-only engine runs no upkeep: every chore writes")
        return self.sweeper.upkeep(held)

    def _mailbox(self, scope: str) -> Mailbox:
        """The mailbox of the actor that owns ``scope``, started if need be.

        Raises:
            ClosedError: the engine is closed.
        """
        mailbox = self._owner.get(scope)
        if mailbox is not None:
            return mailbox
        index = shard_index(scope, len(self._mailboxes))
        mailbox = self._mailboxes[index]
        if mailbox is None:
            with self._lock:
                if self.closed:
                    raise ClosedError("the engine is closed")
                mailbox = self._mailboxes[index]
                if mailbox is None:
                    mailbox = Mailbox(f"{self.key}#{index}", self.store, self.now, self.publish)
                    self._mailboxes[index] = mailbox
        if len(self._owner) >= _OWNERS_KEPT:
            self._owner.clear()  # bounded, however many scopes are written
        self._owner[scope] = mailbox
        return mailbox

    def actors(self) -> int:
        """How many scope actors have started."""
        return sum(1 for mailbox in self._mailboxes if mailbox is not None)

    def reclaim(self) -> None:
        """Another thread runs a request this thread waits for, and may need the turn
        of this process's writers: if a Ctrl-C left it with this thread, it goes back
        first (``_turn``)."""
        self.store.reclaim()

    def wait(self, scope: str, future: ThreadReply[T]) -> T:
        """The result of a request to ``scope``'s actor, within the engine's timeout
        counted from the request, or from the scope's last hand-over if later: a
        request queued behind transactions that take the scope in turn waits as long as
        they move on (see ``Mailbox.moved``).

        Raises:
            OperationTimeout: no answer in time (the request is withdrawn if it can be).
        """
        self.reclaim()
        timeout = self.options.timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                return future.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                moved = self.moved(scope)
                if moved is None or moved + timeout <= deadline:
                    raise operation_timeout(scope, timeout, future) from None
                deadline = moved + timeout

    def publish(self, records: list[ChangeRecord]) -> None:
        """Called right after each commit, in revision order (under the write gate)."""
        expired = 0
        for record in records:  # a loop, not sum() of a generator: every commit comes here
            if record.type == "expired":
                expired += 1
        if expired:
            self.stats.count("keys_expired", expired)
        self.dispatcher.committed(records)

    # -- lifetime ------------------------------------------------------------------
    def attach(self) -> bool:
        """Count one more handle; False if the engine is closed or closing. Called
        under the registry's lock."""
        with self._lock:
            if self.closed:
                return False
            self._handles += 1
            return True

    def detach(self) -> bool:
        """Count one handle fewer; True if it was the last (the caller closes the
        engine then). Called under the registry's lock."""
        with self._lock:
            self._handles -= 1
            return self._handles == 0

    def close(self) -> None:
        """Finish queued writes, stop the actors and the sweeper, release the database."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._on_close(self)
        if self.sweeper is not None:
            self.sweeper.close(self.options.timeout)
        for mailbox in self._mailboxes:
            if mailbox is not None:
                mailbox.close(self.options.timeout)
        # What is pending is delivered within one bounded wait, however many subscribers
        # are stuck: the dispatcher hands on what it holds, every listener is told to
        # finish, then each is waited for until the one deadline.
        deadline = time.monotonic() + FINISH_TIMEOUT
        self.dispatcher.close(FINISH_TIMEOUT)
        self.hub.close(_running_loop(), max(0.0, deadline - time.monotonic()))
        self.store.close()
        logger.debug("closed engine %s", self.key)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    if "asyncio" not in sys.modules:  # no loop runs in a process that never imported it
        return None
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
