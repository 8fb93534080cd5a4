"""``Derivations``: the one registry of an engine's derived values (SPEC §15), which
finds the values a commit touches without testing each one, and computes them again.

The registry keeps an index of the live read sets: the keys read one by one, by
(scope, key), and by scope the values that listed a pattern there. It listens to the
engine's hub for each scope read (one listener a scope: ``_Tap``), so that the follower
reads other processes' changes of those scopes only; each change offered looks its
(scope, key) up, tests the patterns of its scope, and marks the values it touches
dirty. One thread computes the dirty values again, each at the latest snapshot: changes
that arrive together fold into one computation. Values are marked once the batch of
changes the dispatcher hands on is over (``settled``): its commits are whole then, so
an aggregate kept up change by change never shows half a commit.

A value's read set is known only once it ran: after each run it is installed in the
index, and checked against the changes offered since its snapshot (kept a while:
``RECENT``), and against where the listeners of newly read scopes begin; a change that
came between is not missed, the value just runs again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol

from reactor._engine.events import ChangeEvent
from reactor._storage.records import ChangeRecord
from reactor.errors import ClosedError

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .reader import ReadSet


class Derivation(Protocol):
    """What the registry keeps current (``Derivation``, ``Aggregate``)."""

    name: str
    read: ReadSet  # what its last run read: the index holds it

    def follows(self, record: ChangeRecord, event: ChangeEvent) -> bool:
        """A change touched it (on the dispatcher's thread): whether to refresh."""
        ...

    def settle(self) -> None:
        """The changes offered so far make whole commits (dispatcher's thread)."""
        ...

    def missed(self) -> None:
        """A change may have touched it before the index knew."""
        ...

    def refresh(self) -> None:
        """Compute it again, or publish what changed (the registry's thread)."""
        ...

    def engine_closed(self) -> None: ...


__all__ = ["Derivation", "Derivations", "derivations_of"]

logger = logging.getLogger("reactor")

RECENT: Final = 10_000  # changes offered that a new read set is checked against
_KEY: Final = "derivations"  # the registry's key among the hub's shared objects


Where = tuple[str, str | None]  # (scope, key), or (scope, None): every key of it


class _Tap:
    """The registry's listener of one key of a scope, or of the whole scope (where a
    value listed a pattern)."""

    def __init__(self, registry: Derivations, where: Where) -> None:
        self.registry = registry
        self.where = where
        self.begins = 0  # the revision after which it hears every change

    def __repr__(self) -> str:
        return f"<reactor derived values' listener of {self.where!r}>"

    def start(self, published: int) -> None:
        self.begins = published

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:
        self.registry.touched(record, event)

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:
        """Nothing of its own: the registry finishes."""

    def join(self, timeout: float) -> None:
        """Nothing of its own: the registry's thread is joined."""


class Derivations:
    """The derived values of one engine, their read sets' index, and the thread that
    computes them again."""

    def __init__(self, engine: EnginePort) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._exact: dict[tuple[str, str], set[Derivation]] = {}
        self._patterned: dict[str, set[Derivation]] = {}  # scope -> values with patterns
        self._taps: dict[Where, _Tap] = {}
        self._users: dict[Where, int] = {}  # how many values read each
        self._recent: deque[tuple[int, str, str]] = deque(maxlen=RECENT)
        self._dirty: dict[Derivation, None] = {}  # in the order marked
        self._settling: dict[Derivation, None] = {}  # touched in the batch under way
        self.batch = 0  # batches of changes handed on whole so far
        self._offered = 0  # the revision of the last change offered
        self._values: set[Derivation] = set()
        self._over = False
        self._thread = threading.Thread(target=self._loop, name="reactor-derive", daemon=True)
        self._started = False

    def __repr__(self) -> str:
        return f"<reactor derived values: {len(self._values)}>"

    # -- joining ----------------------------------------------------------------------
    def enter(self) -> bool:
        """Join the engine's hub (once): False if this registry is over.

        Raises:
            ClosedError: the engine is closed.
        """
        with self._lock:
            if self._over:
                return False
            if not self._started:
                self.engine.hub.add(self, quiet=True)  # finished when the engine closes
                self.engine.hub.when_settled(self.settled)
                self.engine.hub.after_gap(self.lost)
                self._thread.start()
                self._started = True
            return True

    def add(self, value: Derivation) -> None:
        with self._lock:
            if self._over:
                raise ClosedError("the engine is closed")
            self._values.add(value)

    def remove(self, value: Derivation) -> None:
        """``value`` is closed: out of the index; a scope nobody reads is let go."""
        with self._lock:
            if value not in self._values:
                return
            self._values.discard(value)
            self._dirty.pop(value, None)
            self._unlist(value, value.read)
            gone = self._release(value.read.wheres())
        for tap in gone:
            self.engine.hub.remove(tap)

    def values(self) -> list[Derivation]:
        with self._lock:
            return sorted(self._values, key=lambda value: value.name)

    # -- the index --------------------------------------------------------------------
    def install(self, value: Derivation, read: ReadSet, revision: int | None) -> None:
        """Index what ``value`` read at snapshot ``revision`` in place of what it read
        before; tell it (``missed``) if a change after ``revision`` touched it before
        the index knew (see the module). ``revision`` None: it waits for the next change
        anyway (it failed to build)."""
        with self._lock:
            if value not in self._values:
                return
            before = value.read
            self._unlist(value, before)
            value.read = read
            for key in read.keys:
                self._exact.setdefault(key, set()).add(value)
            for scope in read.patterns:
                self._patterned.setdefault(scope, set()).add(value)
            new_taps = self._hold(read.wheres())
            gone = self._release(before.wheres())
            missed = revision is not None and self._missed(read, before, revision)
        for tap in gone:
            self.engine.hub.remove(tap)
        for tap in new_taps:
            try:
                self.engine.hub.add(tap, *tap.where)
            except ClosedError:
                return
            missed = missed or (revision is not None and tap.begins > revision)
        if missed:
            value.missed()

    def _unlist(self, value: Derivation, read: ReadSet) -> None:
        """Take ``read``, ``value``'s, out of the index (with the lock held)."""
        for key in read.keys:
            holders = self._exact.get(key)
            if holders is not None:
                holders.discard(value)
                if not holders:
                    del self._exact[key]
        for scope in read.patterns:
            holders = self._patterned.get(scope)
            if holders is not None:
                holders.discard(value)
                if not holders:
                    del self._patterned[scope]

    def _hold(self, wheres: set[Where]) -> list[_Tap]:
        """One more value reads each of ``wheres`` (with the lock held); the listeners
        of those nobody read before (to add to the hub)."""
        new: list[_Tap] = []
        for where in wheres:
            self._users[where] = self._users.get(where, 0) + 1
            if where not in self._taps:
                tap = self._taps[where] = _Tap(self, where)
                new.append(tap)
        return new

    def _release(self, wheres: set[Where]) -> list[_Tap]:
        """One value less reads each of ``wheres`` (with the lock held); the listeners
        of those nobody reads now (to remove from the hub)."""
        gone: list[_Tap] = []
        for where in wheres:
            count = self._users.get(where, 0) - 1
            if count > 0:
                self._users[where] = count
                continue
            self._users.pop(where, None)
            tap = self._taps.pop(where, None)
            if tap is not None:
                gone.append(tap)
        return gone

    def _missed(self, read: ReadSet, before: ReadSet, revision: int) -> bool:
        """Whether a change after ``revision``, offered already, touches ``read`` and
        not ``before`` (what the index held: a change touching that reached the value),
        or may have (the changes kept begin after ``revision``)."""
        if read.same_as(before):
            return False
        recent = self._recent
        if len(recent) == recent.maxlen and recent[0][0] > revision:
            return True
        for changed, scope, key in reversed(recent):
            if changed <= revision:
                return False
            if read.touched_by(scope, key) and not before.touched_by(scope, key):
                return True
        return False

    # -- changes ----------------------------------------------------------------------
    def touched(self, record: ChangeRecord, event: ChangeEvent) -> None:
        """A change of a scope read (on the dispatcher's thread): mark what it
        touches, or hand it to the values kept up from each event (``count``,
        ``sum``)."""
        scope, key = record.scope, record.key
        with self._lock:
            if record.revision == self._offered:
                return  # offered again by another of the registry's listeners
            self._offered = record.revision
            self._recent.append((record.revision, scope, key))
            found = set(self._exact.get((scope, key), ()))
            for value in self._patterned.get(scope, ()):
                if value.read.touched_by(scope, key):
                    found.add(value)
        touched = [value for value in found if value.follows(record, event)]
        if touched:
            with self._lock:
                self._settling.update(dict.fromkeys(touched))

    def settled(self) -> None:
        """The changes offered so far make whole commits (after each batch the
        dispatcher hands on): what they touched is computed again, or published (an
        aggregate must not show half a commit)."""
        with self._lock:
            self.batch += 1  # the batch that ended is whole
            settling, self._settling = self._settling, {}
        for value in settling:
            value.settle()
        with self._lock:
            if not self._over and settling:
                self._dirty.update(settling)
                self._wake.notify()

    def lost(self) -> None:
        """Changes were compacted away unread: every value may be out of date, and is
        computed (or built) again."""
        for value in self.values():
            value.missed()

    def mark(self, value: Derivation) -> None:
        with self._lock:
            if value in self._values and not self._over:
                self._dirty[value] = None
                self._wake.notify()

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._dirty and not self._over:
                    self._wake.wait()
                if self._over:
                    return
                batch = list(self._dirty)
                self._dirty.clear()
            for value in batch:
                try:
                    value.refresh()
                except Exception:  # a bug of ours must not stop the others
                    logger.exception("computing derived value %r again failed", value.name)

    # -- the hub's side (a quiet ``Listener``: told when the engine closes) -------------
    def start(self, published: int) -> None:
        """Not told: quiet."""

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:
        """Not offered anything: quiet."""

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - a Listener's call
        """The engine is closing: every value is closed, the thread stops."""
        with self._lock:
            self._over = True
            values = list(self._values)
            self._wake.notify_all()
        self.engine.hub.forget_shared(_KEY, self)
        for value in values:
            value.engine_closed()

    def join(self, timeout: float) -> None:
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout)


def derivations_of(engine: EnginePort) -> Derivations:
    """The engine's registry (made, and joined to the hub, the first time).

    Raises:
        ClosedError: the engine is closed.
    """
    return engine.hub.join_shared(_KEY, lambda: Derivations(engine), Derivations.enter)
