"""Scope actors: the single writers that own scopes.

Scopes are spread over a bounded set of pykka actors by a stable hash of their name,
so each scope has exactly one owner and an engine never holds more than ``max_actors``
actor threads, however many scopes it touches.

A write is a request queued in the owner's mailbox; the actor takes every queued
request at once and runs them in one database transaction (group commit), answering
each caller after the commit. A request that fails is undone alone; a commit that fails
fails the whole batch, and nothing of it is applied.

An uncontended write does not wait for the actor's thread to wake up: when nothing is
queued and no batch is running, the caller runs its request itself, holding the same
``_running`` lock the actor holds for a batch, so a scope still has exactly one writer
at a time. Under contention requests queue, and the actor commits them together.

A transaction takes a scope for itself: from its ``begin`` request on, the actor defers
every other request for that scope (and goes on with other scopes) until the
transaction's commit or rollback releases it. A transaction over several scopes takes
each from its actor, and commits through the first one's, naming them all. Each
hand-over of a scope (taken by a transaction, given back) is noted with the time: a
request waiting for a scope that others hold in turn counts its timeout from the
scope's last hand-over, not from when it queued (``moved``), so a long queue of
transactions on one scope never times out while it moves, and a scope held by a
transaction that is stuck still does.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

import pykka

from reactor._base.turn import Turn
from reactor._storage.records import ChangeRecord, Entangled, RefusedError, copy_error
from reactor._storage.store import Store
from reactor._storage.txn import Work, WriteTxn
from reactor.errors import ClosedError, StorageError

from .reply import ThreadReply

__all__ = ["Mailbox", "Reply", "Request", "shard_index"]

logger = logging.getLogger("reactor")

CommitHook = Callable[[list[ChangeRecord]], None]

_DRAIN: Final = "drain"
T = TypeVar("T")
_MOVED_KEEP: Final = 1024  # hand-over times kept before those of idle scopes are dropped


def shard_index(scope: str, shards: int) -> int:
    """The actor that owns ``scope``: stable across runs, unlike ``hash()``."""
    return zlib.crc32(scope.encode("utf-8", "surrogatepass")) % shards


class Reply(Protocol):
    """Where a request's outcome goes, settled once by the actor: a
    ``ThreadReply``, or anything that settles like one (an asyncio
    caller's answer, ``aio.bridge.Answer``, wakes its event loop with no thread
    waiting and no ``Condition``)."""

    def set_running_or_notify_cancel(self) -> bool:
        """Mark it running unless it was cancelled; whether it runs."""
        ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException | None) -> None: ...

    def cancel(self) -> bool:
        """Withdraw it if it is not running yet; whether it was withdrawn."""
        ...


class Request:
    """One write: the work to run in the transaction, and where its outcome goes
    (``reply``: a new ``ThreadReply`` unless given).

    ``owner`` marks the requests of a transaction holding ``scope``; a request with
    no work is a transaction's ``begin`` (asking for the scope for ``owner``).
    ``scopes``: every scope the work writes (the commit of a transaction over several
    scopes; the owner holds them all, and the database transaction keeps other
    processes off them all), ``(scope,)`` by default. ``alone``: committed in a
    transaction of its own, never with other requests (the sweeper's timers: a write
    the database refuses then fails no other request).
    """

    __slots__ = ("alone", "future", "owner", "scope", "scopes", "work")

    def __init__(
        self,
        work: Work[Any] | None,
        scope: str,
        owner: object = None,
        scopes: tuple[str, ...] | None = None,
        *,
        alone: bool = False,
        reply: Reply | None = None,
    ) -> None:
        self.work = work
        self.scope = scope
        self.owner = owner
        self.scopes = (scope,) if scopes is None else scopes
        self.alone = alone
        self.future: Reply = ThreadReply() if reply is None else reply


class _ScopeActor(pykka.ThreadingActor):
    # Daemon thread: an engine left open must not keep the interpreter alive. Nothing
    # acknowledged is at stake, since a caller hears of a write only after its commit;
    # an atexit hook still closes open engines in order.
    use_daemon_thread = True

    def __init__(self, mailbox: Mailbox) -> None:
        super().__init__()
        self._mailbox = mailbox

    @staticmethod
    def _create_actor_inbox() -> queue.SimpleQueue[Any]:
        # pykka's default, a queue.Queue, enters a threading.Condition in Python on each
        # put: a Ctrl-C landing right after its lock was taken leaves that lock held,
        # and every later ``tell`` waits for ever (see ``reply``). A SimpleQueue's put
        # is one C call.
        return queue.SimpleQueue()

    def on_receive(self, message: Any) -> Any:
        if message == _DRAIN:
            self._mailbox.run_pending()


class Mailbox:
    """The queue of write requests for the scopes one actor owns."""

    def __init__(
        self, name: str, store: Store, clock: Callable[[], float], on_commit: CommitHook
    ) -> None:
        self._name = name
        self._store = store
        self._clock = clock
        self._on_commit = on_commit
        self._pending: deque[Request] = deque()
        self._deferred: deque[Request] = deque()  # requests for scopes a transaction holds
        self._owners: dict[str, object] = {}  # scope -> the transaction holding it
        self._moved: dict[str, float] = {}  # scope -> its last hand-over (time.monotonic)
        self._lock = threading.Lock()
        self._running = Turn()  # held by whoever runs a batch: actor or caller
        self._scheduled = False
        self._closed = False
        self._actor: pykka.ActorRef[Any] | None = None

    def submit(self, request: Request) -> None:
        """Queue ``request`` for the actor; its reply gets the result of its work after
        the commit (a begin's is settled once the scope is held).

        Raises:
            ClosedError: the engine is closing.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("the engine is closed")
            if request.work is None and request.scope in self._owners:
                self._drop_lost_hold(request.scope)
            self._pending.append(request)
            if not self._scheduled:  # _schedule's own test, saving a call per request
                self._schedule()

    def call(self, work: Work[T], scope: str, wait: Callable[[ThreadReply[T]], T]) -> T:
        """Run ``work`` on ``scope`` and return its result once committed: at once in
        this thread when the mailbox is idle; else queued for the actor, its future
        handed to ``wait`` (``Engine.wait``: within a timeout).

        Raises:
            ClosedError: the engine is closing.
        """
        inline = False
        # The try begins before the turn is taken: leaving the ``with`` is a call into
        # C, after which a Ctrl-C may land (see ``_turn``).
        try:
            with self._lock:
                if self._closed:
                    raise ClosedError("the engine is closed")
                if scope in self._owners:
                    self._drop_lost_hold(scope)
                inline = (
                    not self._pending and scope not in self._owners and self._running.try_take()
                )
            if not inline:
                future: ThreadReply[T] = ThreadReply()
                self.submit(Request(work, scope, reply=future))
                return wait(future)
            # No batch, no future: one request, one transaction; an error rolls it back.
            result, _ = self._store.write(
                work.run,
                self._clock(),
                self._on_commit,
                shared=True,
                scopes=(scope,),
                reads=work.reads,
            )
            return result
        finally:
            if inline:
                self._running.give_back()

    def moved(self, scope: str) -> float | None:
        """When (``time.monotonic()``) a transaction last took ``scope`` or gave it back,
        if one did lately: what a request waiting for the scope counts its timeout from."""
        return self._moved.get(scope)

    def _drop_lost_hold(self, scope: str) -> None:
        """Release ``scope`` if a hold of this very thread has it (called with the lock
        held, by a thread asking for the scope outside any transaction body on it): a
        synchronous transaction's hold that a Ctrl-C kept from being given back. A
        thread in a body on a scope cannot also ask for it (``ReentrancyError``)."""
        owner = self._owners[scope]
        if getattr(owner, "thread", None) == threading.get_ident():
            logger.info("scope %r: a transaction interrupted in this thread gave it back", scope)
            self._release(scope, owner)

    def release(self, scope: str, owner: object) -> None:
        """End ``owner``'s hold on ``scope``; the requests it deferred run next."""
        with self._lock:
            self._release(scope, owner)

    def _release(self, scope: str, owner: object) -> None:
        if self._owners.get(scope) is not owner:
            return
        del self._owners[scope]
        if len(self._moved) >= _MOVED_KEEP:
            # Forget the scopes nobody holds or waits for: a waiter compares times,
            # and one that finds none counts from when it queued.
            keep = {*self._owners, *(request.scope for request in self._deferred)}
            self._moved = {name: at for name, at in self._moved.items() if name in keep}
        self._moved[scope] = time.monotonic()
        if self._deferred:
            self._pending.extendleft(reversed(self._deferred))
            self._deferred.clear()
            if not self._closed:
                self._schedule()

    def _schedule(self) -> None:
        """Make sure the actor will look at the queue (called with the lock held)."""
        if self._scheduled:
            return
        if self._actor is None:
            self._actor = _ScopeActor.start(self)
            logger.debug("started scope actor %s", self._name)
        # tell, not ask: run_pending never raises (each failure goes to its request's
        # future), so nothing here can stop the actor, and nobody waits on a reply.
        # If close() stopped the actor meanwhile, it fails what is still queued.
        with contextlib.suppress(pykka.ActorDeadError):
            self._actor.tell(_DRAIN)
        # Noted last: a Ctrl-C before this line leaves the next request to schedule
        # again (one drain too many is harmless; none at all would strand the queue).
        self._scheduled = True

    def run_pending(self) -> None:
        """Run every queued request, in order, in as few transactions as the scopes
        that transactions take allow (on the actor's thread)."""
        self._running.take(-1)  # a caller running its request inline finishes it first
        try:
            self._run_pending()
        finally:
            self._running.give_back()

    def _run_pending(self) -> None:
        with self._lock:
            queued = list(self._pending)
            self._pending.clear()
            self._scheduled = False
        batch: list[Request] = []
        for request in queued:
            with self._lock:
                owner = self._owners.get(request.scope)
                if owner is not None and owner is not request.owner:
                    self._deferred.append(request)  # the scope is held: wait for release
                    continue
            if not request.future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting
            if request.work is not None and not request.alone:
                batch.append(request)
                continue
            if request.work is not None:  # in order: after what came before it
                if batch:
                    self._run(batch)
                    batch = []
                self._run([request], shared=False)
                continue
            # A transaction's begin: what came before it commits first.
            if batch:
                self._run(batch)
                batch = []
            with self._lock:
                # A transaction that gave up meanwhile (a Ctrl-C may have kept its
                # future from it, so it could not withdraw this request) gets nothing:
                # it sets its status before it gives scopes back, under this lock.
                if getattr(request.owner, "status", "waiting") == "waiting":
                    self._owners[request.scope] = request.owner
                    self._moved[request.scope] = time.monotonic()
            request.future.set_result(None)
        if batch:
            self._run(batch)

    def _run(self, batch: list[Request], *, shared: bool = True) -> None:
        """Run ``batch`` in one transaction (``shared``: which may commit together
        with other actors' batches)."""

        def work(txn: WriteTxn) -> list[tuple[bool, Any]]:
            outcomes: list[tuple[bool, Any]] = []
            for request in batch:
                mark = txn.savepoint()
                try:
                    assert request.work is not None
                    outcomes.append((True, request.work.run(txn)))
                except (StorageError, ClosedError):
                    raise  # the transaction itself failed: the whole batch fails
                except Exception as exc:  # it goes back to its caller
                    if txn.rollback_to(mark):
                        outcomes.append((False, exc))
                    elif len(batch) > 1:  # only the abort takes its statements back
                        raise Entangled(f"a request failed after its statements: {exc}") from exc
                    else:
                        raise
            return outcomes

        try:
            outcomes, _ = self._store.write(
                work,
                self._clock(),
                self._on_commit,
                shared=shared,
                scopes={name for request in batch for name in request.scopes},
                # One read for the batch rather than one per request: each statement
                # hands the GIL over, and waits to get it back.
                reads=[key for request in batch if request.work for key in request.work.reads],
            )
        except RefusedError as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(copy_error(exc))
                return
            # The database refused one request's statement, and the whole transaction
            # with it (nothing was applied): each request runs alone.
            for request in batch:
                self._run([request], shared=shared)
            return
        except Exception as exc:  # noqa: BLE001 - every caller hears of it
            for request in batch:
                request.future.set_exception(copy_error(exc))
            return
        for request, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                request.future.set_result(value)
            else:
                request.future.set_exception(value)

    def close(self, timeout: float) -> None:
        """Finish what is queued, stop the actor, and refuse new requests."""
        self._running.reclaim()  # lost by this thread to a Ctrl-C: the actor waits for it
        with self._lock:
            self._closed = True
            actor, self._actor = self._actor, None
        if actor is not None:
            try:
                actor.stop(block=True, timeout=timeout)
            except pykka.Timeout:
                logger.warning("scope actor %s did not stop within %s s", self._name, timeout)
            except pykka.ActorDeadError:
                pass
            logger.debug("stopped scope actor %s", self._name)
        with self._lock:
            leftover = [*self._pending, *self._deferred]
            self._pending.clear()
            self._deferred.clear()
        for request in leftover:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(ClosedError("the engine closed before this write ran"))
