"""Scope actors: the single writers that own scopes.

Scopes are spread over a bounded set of pykka actors by a stable hash of their name,
so each scope has exactly one owner and an engine never holds more than ``max_actors``
actor threads, however many scopes it touches.

A write is a request queued in the owner's mailbox; the actor takes every queued
request at once and runs them in one database transaction (group commit), answering
each caller after the commit. A request that fails is undone alone; a commit that fails
fails the whole batch, and nothing of it is applied.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final

import pykka

from ._store import ChangeRecord, Store, WriteTxn
from .errors import ClosedError, ReactorError, StorageError

__all__ = ["Mailbox", "Request", "shard_index"]

logger = logging.getLogger("reactor")

Work = Callable[[WriteTxn], Any]
CommitHook = Callable[[list[ChangeRecord]], None]

_DRAIN: Final = "drain"


def shard_index(scope: str, shards: int) -> int:
    """The actor that owns ``scope``: stable across runs, unlike ``hash()``."""
    return zlib.crc32(scope.encode("utf-8", "surrogatepass")) % shards


class Request:
    """One write: the work to run in the transaction, and the caller's future."""

    __slots__ = ("future", "work")

    def __init__(self, work: Work) -> None:
        self.work = work
        self.future: Future[Any] = Future()


class _ScopeActor(pykka.ThreadingActor):
    # Daemon thread: an engine left open must not keep the interpreter alive. Nothing
    # acknowledged is at stake, since a caller hears of a write only after its commit;
    # an atexit hook still closes open engines in order.
    use_daemon_thread = True

    def __init__(self, mailbox: Mailbox) -> None:
        super().__init__()
        self._mailbox = mailbox

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
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = False
        self._actor: pykka.ActorRef[Any] | None = None

    def submit(self, work: Work) -> Future[Any]:
        """Queue ``work`` for the actor; the future holds its result after commit.

        Raises:
            ClosedError: the engine is closing.
        """
        request = Request(work)
        with self._lock:
            if self._closed:
                raise ClosedError("the engine is closed")
            self._pending.append(request)
            if self._scheduled:
                return request.future
            self._scheduled = True
            if self._actor is None:
                self._actor = _ScopeActor.start(self)
                logger.debug("started scope actor %s", self._name)
            actor = self._actor
        # tell, not ask: run_pending never raises (each failure goes to its request's
        # future), so nothing here can stop the actor, and nobody waits on a reply.
        # If close() stopped the actor meanwhile, it fails what is still queued.
        with contextlib.suppress(pykka.ActorDeadError):
            actor.tell(_DRAIN)
        return request.future

    def run_pending(self) -> None:
        """Run every queued request in one transaction (on the actor's thread)."""
        with self._lock:
            batch = [r for r in self._pending if r.future.set_running_or_notify_cancel()]
            self._pending.clear()
            self._scheduled = False
        if batch:
            self._run(batch)

    def _run(self, batch: list[Request]) -> None:
        def work(txn: WriteTxn) -> list[tuple[bool, Any]]:
            outcomes: list[tuple[bool, Any]] = []
            for request in batch:
                mark = txn.savepoint()
                try:
                    outcomes.append((True, request.work(txn)))
                except StorageError:
                    raise  # the transaction itself failed: the whole batch fails
                except Exception as exc:  # noqa: BLE001 - it goes back to its caller
                    txn.rollback_to(mark)
                    outcomes.append((False, exc))
            return outcomes

        try:
            outcomes, records = self._store.write(work, self._clock())
        except Exception as exc:  # noqa: BLE001 - every caller hears of it
            for request in batch:
                request.future.set_exception(_copy_error(exc))
            return
        for request, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                request.future.set_result(value)
            else:
                request.future.set_exception(value)
        if records:
            self._on_commit(records)

    def close(self, timeout: float) -> None:
        """Finish what is queued, stop the actor, and refuse new requests."""
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
            leftover = list(self._pending)
            self._pending.clear()
        for request in leftover:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(ClosedError("the engine closed before this write ran"))


def _copy_error(exc: Exception) -> Exception:
    """A fresh error per caller, so that tracebacks of concurrent raisers do not mix."""
    if isinstance(exc, ReactorError):
        fresh = type(exc)(*exc.args)
        fresh.__cause__ = exc.__cause__
        return fresh
    failure = StorageError(f"the write failed: {exc!r}")
    failure.__cause__ = exc
    return failure
