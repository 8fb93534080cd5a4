"""``Hub``: the one place an engine's listeners join to hear of committed changes.

Subscriptions and watches, ``wait_for``'s waiters, the lines of waiting queue takes and
those of lock waiters all listen the same way (``Listener``): the hub tells each the
last revision published as it joins (``start``), hands it the changes it listens to
(``offer``, on the dispatcher's thread), and, when the engine closes, tells it to
finish (``finish``) and waits for it (``join``). Listeners are indexed by what they
listen to — one key of one scope, one scope, or everything — so a change costs one dict
lookup per index, not one call per listener: a thousand ``wait_for`` calls on other
keys cost a change nothing. A listener that hears of no change (a lock's line: a lease
is no key) joins ``quiet``, only to be told to finish when the engine closes.

The hub is connected to the dispatcher only while someone listens: the dispatcher reads
other processes' changes only then.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from reactor._storage.records import ChangeRecord
from reactor.errors import ClosedError, InvalidArgumentError

from .dispatch import Dispatcher
from .events import ChangeEvent

__all__ = ["Hub", "Listener"]

logger = logging.getLogger("reactor")

A = TypeVar("A")
_UNKNOWN: Final = object()  # listened() must look again

# At most this many scopes listened to are named in the dispatcher's reads of the log;
# with more, it reads every change.
LISTED_SCOPES: Final = 64


class Listener(Protocol):
    """What joins the hub."""

    def start(self, published: int) -> None:
        """Told as it joins: every change after revision ``published`` is offered to it
        (some before it may be too, still queued: it ignores those)."""
        ...

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:
        """A change it listens to (on the dispatcher's thread: be quick)."""
        ...

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:
        """The engine is closing: what it had to deliver has been offered."""
        ...

    def join(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until it has delivered what it holds."""
        ...


Where = tuple[str | None, str | None]  # (scope, key): None for any


class Hub:
    """The listeners of one engine, by the scope and key they listen to."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._lock = threading.Lock()  # the index; short, taken on the dispatcher thread
        self._joining = threading.Lock()  # joins and leaves, with (dis)connecting, in turn
        self._index: dict[Where, set[Listener]] = {}
        self._where: dict[Listener, Where] = {}
        self._quiet: set[Listener] = set()
        self._durable: dict[str, Listener] = {}
        self._shared: dict[object, Any] = {}
        self._closed = False
        self._receiver = self._receive  # one object, to connect and disconnect
        self._scopes: dict[str | None, int] = {}  # scope -> places of it listened to
        self._listened: frozenset[str] | object | None = _UNKNOWN  # listened(), kept
        self._settled: list[Callable[[], None]] = []  # told after each batch of changes
        self._gaps: list[Callable[[], None]] = []  # told when changes were lost
        dispatcher.on_settled = self._on_settled
        dispatcher.on_gap = self._on_gap

    # -- joining and leaving -------------------------------------------------------
    def add(
        self,
        listener: Listener,
        scope: str | None = None,
        key: str | None = None,
        *,
        durable: str | None = None,
        quiet: bool = False,
    ) -> None:
        """From now on, offer ``listener`` the changes of ``key`` of ``scope`` (None:
        of any key, of any scope) after the revision its ``start`` is told; ``quiet``:
        none at all (it only finishes with the engine, and is not ``start``ed).

        Raises:
            ClosedError: the engine is closed.
            InvalidArgumentError: ``durable`` names a subscriber listening already.
        """
        if quiet:  # no dispatcher to connect: only the index's lock (a loop may call)
            with self._lock:
                if self._closed:
                    raise ClosedError("the engine is closed")
                self._quiet.add(listener)
            return
        where = (scope, key if scope is not None else None)
        with self._joining:
            with self._lock:
                if self._closed:
                    raise ClosedError("the engine is closed")
                if durable is not None:
                    if durable in self._durable:
                        raise InvalidArgumentError(
                            f"durable subscriber {durable!r} is already subscribed in this process"
                        )
                    self._durable[durable] = listener
                if where not in self._index:
                    self._scopes[where[0]] = self._scopes.get(where[0], 0) + 1
                    self._listened = _UNKNOWN
                self._index.setdefault(where, set()).add(listener)
                self._where[listener] = where
            # Connecting a connected receiver again changes nothing in the signal, but
            # tells ``start``, under the dispatcher's lock, the last revision published:
            # every later change is sent after this, and finds the listener indexed.
            self._dispatcher.connect(self._receiver, listener.start, self.listened, self.hears)

    def remove(self, listener: Listener) -> None:
        """Stop offering ``listener`` anything; idempotent. The last one out
        disconnects the hub from the dispatcher."""
        with self._lock:
            if listener in self._quiet:
                self._quiet.discard(listener)
                return
        with self._joining:
            with self._lock:
                where = self._where.pop(listener, None)
                if where is None:
                    return
                listeners = self._index[where]
                listeners.discard(listener)
                if not listeners:
                    del self._index[where]
                    left = self._scopes[where[0]] - 1
                    if left:
                        self._scopes[where[0]] = left
                    else:
                        del self._scopes[where[0]]
                    self._listened = _UNKNOWN
                for name, held in list(self._durable.items()):
                    if held is listener:
                        del self._durable[name]
                empty = not self._where
            if empty:
                self._dispatcher.disconnect()

    def listened(self) -> frozenset[str] | None:
        """The scopes whose changes the listeners hear (None: every scope's, or more
        scopes than a read of the log names one by one); kept until a listener of a
        new place joins or the last of one leaves (the follower asks at each look)."""
        with self._lock:
            found = self._listened
            if found is _UNKNOWN:
                scopes = self._scopes
                if None in scopes or len(scopes) > LISTED_SCOPES:
                    found = None
                else:
                    found = frozenset(scope for scope in scopes if scope is not None)
                self._listened = found
        return found  # type: ignore[return-value]

    def hears(self, scope: str, key: str) -> bool:
        """Whether a listener hears a change of ``key`` of ``scope`` (an unlocked look
        at the index: a listener joining meanwhile is told where it begins)."""
        index = self._index
        return (scope, key) in index or (scope, None) in index or (None, None) in index

    def when_settled(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (on the dispatcher's thread) after each batch of changes
        offered: the commits offered so far are whole then."""
        with self._lock:
            self._settled.append(hook)

    def after_gap(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when changes were compacted away before they were offered
        (what was kept from them is out of date)."""
        with self._lock:
            self._gaps.append(hook)

    def _on_gap(self) -> None:
        with self._lock:
            hooks = list(self._gaps)
        for hook in hooks:
            hook()

    def _on_settled(self) -> None:
        with self._lock:
            hooks = list(self._settled)
        for hook in hooks:
            hook()

    def listeners(self) -> list[Listener]:
        """Every listener joined now (quiet ones too)."""
        with self._lock:
            return [*self._where, *self._quiet]

    def durable_in_use(self, name: str) -> bool:
        with self._lock:
            return name in self._durable

    def join_shared(self, key: object, make: Callable[[], A], enter: Callable[[A], bool]) -> A:
        """Enter the one object of this engine's listeners under ``key`` (made by
        ``make`` the first time), what listeners of one kind share, such as a queue's
        line; return it. ``enter(shared)`` is False when that object is over (its last
        member left, and it is leaving the hub): a new one takes its place, and is
        entered instead.

        Raises:
            ClosedError: as ``enter`` raises it (the engine is closed).
        """
        while True:
            with self._lock:
                found = self._shared.get(key)
                if found is None:
                    found = self._shared[key] = make()
            if enter(found):
                return found

    def find_shared(self, key: object) -> Any:
        """The object under ``key``, or None if there is none now."""
        with self._lock:
            return self._shared.get(key)

    def forget_shared(self, key: object, shared: object) -> None:
        """Drop ``shared`` from under ``key`` (if it is still the one there)."""
        with self._lock:
            if self._shared.get(key) is shared:
                del self._shared[key]

    # -- delivery --------------------------------------------------------------------
    def _receive(self, record: ChangeRecord, event: ChangeEvent) -> None:
        index = self._index
        with self._lock:
            found = [
                *index.get((record.scope, record.key), ()),
                *index.get((record.scope, None), ()),
                *index.get((None, None), ()),
            ]
        for listener in found:
            try:
                listener.offer(record, event)
            except Exception:  # one listener's failure is its own
                logger.exception("%r failed to take %r", listener, event)

    # -- closing ---------------------------------------------------------------------
    def close(self, loop: asyncio.AbstractEventLoop | None, timeout: float) -> None:
        """Refuse new listeners; tell every listener to finish, then wait for each, all
        within ``timeout`` seconds (the dispatcher has handed on what it held)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            listeners = [*self._where, *self._quiet]
        for listener in listeners:
            listener.finish(loop)
        for listener in listeners:
            listener.join(max(0.0, deadline - time.monotonic()))
