"""``DerivedValue``: a function of the state that stays current (SPEC §15).

``state.derive(fn)`` runs ``fn`` with a ``Reader`` at once, and again after each commit
that changed something it read (``Derivations`` finds those). A result is published
only when it differs from the last one (JSON equality); subscribers get every
published value once, in revision order, on a thread of their own each; watches may
skip to the latest. ``state.count`` and ``state.sum`` are kept up from each change's
old and new value (``Aggregate``) rather than by reading again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from reactor._base.results import Derived
from reactor._base.values import decode, encode, json_equal
from reactor._engine.events import ChangeEvent
from reactor._storage.records import ChangeRecord
from reactor.errors import ClosedError, InvalidArgumentError, OperationTimeout, ReactorError

from .derivations import Derivations, derivations_of
from .reader import Reader, ReadSet
from .scope import Scope

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["DerivedValue", "check_into"]

logger = logging.getLogger("reactor")

WATCH_BUFFER: Final = 1000  # published values a watch holds before it skips the oldest
Function = Callable[[Reader], Any]


def check_into(into: object) -> tuple[str, str] | None:
    """``into``: None, or a (scope, key) pair.

    Raises:
        InvalidArgumentError: anything else.
    """
    if into is None:
        return None
    if not isinstance(into, tuple) or len(into) != 2:
        raise InvalidArgumentError(f"into must be a (scope, key) pair, not {into!r}")
    return str(into[0]), str(into[1])


class DerivedValue:
    """A derived value: ``value`` and the ``revision`` it is consistent with, kept
    current until ``close()`` or the engine's close."""

    def __init__(
        self,
        binding: Binding,
        fn: Function,
        name: str,
        into: tuple[str, str] | None,
    ) -> None:
        self._binding = binding
        self._fn = fn
        self.name = name
        """What it is called (``derive``'s ``name``, or the function's)."""
        self.value: Any = None
        """The last result published (None before the first)."""
        self.revision = 0
        """The revision of the last result published."""
        self.error: BaseException | None = None
        """The last exception of the function; None again after a good run."""
        self.recomputations = 0
        """How many times the function ran."""
        self.read = ReadSet()  # what the last run read (the registry's index holds it)
        self.read_at = 0  # the revision of the last run's snapshot
        self._into = into if into is None else (Scope(binding, into[0]), into[1])
        self._lock = threading.Condition()
        self._computing = threading.Lock()
        self._published = False
        self._closed = False
        self._deliveries: list[_Delivery] = []
        self._watches: list[_Watch] = []
        self._listeners: list[Callable[[Derived | None], None]] = []  # quick: see listen
        self._registry: Derivations = derivations_of(binding.engine)

    def __repr__(self) -> str:
        return f"<reactor.DerivedValue {self.name!r} = {self.value!r} at {self.revision}>"

    def open(self) -> DerivedValue:
        """Compute it now, and keep it current from then on."""
        self._registry.add(self)
        self.refresh()
        return self

    # -- computing -------------------------------------------------------------------
    def follows(self, record: ChangeRecord, event: ChangeEvent) -> bool:  # noqa: ARG002 - Aggregate's needs it
        """A change touched what it read (on the dispatcher's thread): whether to
        compute it again (not if its last run's snapshot holds the change)."""
        return record.revision > self.read_at

    def settle(self) -> None:
        """The changes offered so far make whole commits (on the dispatcher's thread):
        nothing to do, it reads a snapshot."""

    def missed(self) -> None:
        """A change may have touched what it read before the index knew: run again."""
        self._registry.mark(self)

    def refresh(self) -> None:
        """Run the function at a fresh snapshot; publish a result that differs. One
        run at a time (the registry's thread, or ``open``'s caller)."""
        with self._computing, contextlib.suppress(ClosedError):  # closed meanwhile
            self._refresh()

    def _refresh(self) -> None:
        engine = self._binding.engine
        options = engine.options
        reader: Reader | None = None
        text: str | None = None
        failure: BaseException | None = None
        try:
            with engine.store.consistent_reads() as snapshot:
                reader = Reader(snapshot, engine.now())
                result = self._fn(reader)
                if inspect.isawaitable(result):  # an async function: on this thread's loop
                    result = _run_coroutine(result)
            text = encode(result, max_depth=options.max_depth, max_bytes=options.max_value_bytes)
        except ClosedError:
            return
        except Exception as exc:  # noqa: BLE001 - the function's, or the database's: kept
            failure = exc
        if reader is not None:  # what it read so far: a change of it runs it again
            self.recomputations += 1
            self.read_at = reader.revision
            self._registry.install(self, reader.read, reader.revision)
        if failure is not None or text is None or reader is None:
            self._failed(failure or ClosedError("no snapshot"))
            return
        self.error = None
        self._offer(decode(text), reader.revision)

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        logger.error("derived value %r failed: %s", self.name, exc, exc_info=exc)

    def _offer(self, value: Any, revision: int) -> None:
        """Publish ``value`` (at ``revision``) if it differs from the last one."""
        with self._lock:
            if self._closed or revision < self.revision:
                return
            if self._published and json_equal(value, self.value):
                return
            old, self.value, self.revision = self.value, value, revision
            self._published = True
            derived = Derived(value, old, revision)
            self._lock.notify_all()
            for delivery in self._deliveries:
                delivery.put(derived)
            for watch in self._watches:
                watch.put(derived)
            for listener in self._listeners:
                listener(derived)
        if self._into is not None:
            scope, key = self._into
            try:
                scope.set(key, value)
            except ReactorError:
                logger.exception(
                    "derived value %r: writing it to %s/%s failed", self.name, scope.name, key
                )

    # -- the verbs --------------------------------------------------------------------
    def subscribe(self, callback: Callable[[Derived], Any]) -> Callable[[], None]:
        """Call ``callback(Derived)`` with each value published from now on, in order,
        on a thread of its own; what stops it.

        Raises:
            ClosedError: the value is closed.
        """
        if not callable(callback):
            raise InvalidArgumentError(f"callback must be callable, not {callback!r}")
        delivery = _Delivery(self.name, callback)
        with self._lock:
            if self._closed:
                raise ClosedError(f"derived value {self.name!r} is closed")
            self._deliveries.append(delivery)
        delivery.start()

        def stop() -> None:
            with self._lock:
                if delivery in self._deliveries:
                    self._deliveries.remove(delivery)
            delivery.stop()

        return stop

    def wait_for(self, predicate: Callable[[Any], bool], timeout: float | None = None) -> Any:
        """The first value (the current one first) for which ``predicate`` is true.

        Raises:
            OperationTimeout: none within ``timeout`` seconds.
            ClosedError: the value was closed meanwhile.
        """
        if not callable(predicate):
            raise InvalidArgumentError(f"predicate must be callable, not {predicate!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            seen = -1
            while True:
                if self._published and self.revision != seen:
                    seen = self.revision
                    if predicate(self.value):
                        return self.value
                if self._closed:
                    raise ClosedError(f"derived value {self.name!r} is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise OperationTimeout(f"derived value {self.name!r} did not match in time")
                self._lock.wait(left)

    def watch(self) -> Iterator[Derived]:
        """The published values, from the current one on (a watch that falls behind
        skips to the latest); it ends when the value or the engine is closed."""
        watch = _Watch()
        with self._lock:
            if self._closed:
                raise ClosedError(f"derived value {self.name!r} is closed")
            if self._published:
                watch.put(Derived(self.value, None, self.revision))
            self._watches.append(watch)
        try:
            yield from watch
        finally:
            with self._lock:
                if watch in self._watches:
                    self._watches.remove(watch)

    def listen(self, listener: Callable[[Derived | None], None]) -> Callable[[], None]:
        """Call ``listener`` with each value published from now on, on the publishing
        thread and with the value's lock held (so: at once, no waiting, no reading),
        and with None when the value is closed; what stops it. ``reactor.aio`` hands
        the values to its loop this way. The current value is read after: a value
        published in between is both heard and read.

        Raises:
            ClosedError: the value is closed.
        """
        with self._lock:
            if self._closed:
                raise ClosedError(f"derived value {self.name!r} is closed")
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return stop

    def current(self) -> Derived | None:
        """The last value published, as a ``Derived`` (None before the first)."""
        with self._lock:
            return Derived(self.value, None, self.revision) if self._published else None

    def close(self) -> None:
        """Stop keeping it current; idempotent."""
        self._registry.remove(self)
        self.engine_closed()

    def engine_closed(self) -> None:
        with self._lock:
            self._closed = True
            deliveries, self._deliveries = self._deliveries, []
            watches, self._watches = self._watches, []
            listeners, self._listeners = self._listeners, []
            for listener in listeners:
                listener(None)
            self._lock.notify_all()
        for watch in watches:
            watch.end()
        for delivery in deliveries:
            delivery.stop()

    def __enter__(self) -> DerivedValue:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class _Delivery:
    """One subscriber's queue and thread: its callback is called in order, and a slow
    one holds up nobody else."""

    def __init__(self, name: str, callback: Callable[[Derived], Any]) -> None:
        self._name = name
        self._callback = callback
        self._queue: deque[Derived | None] = deque()
        self._ready = threading.Condition()
        self._thread = threading.Thread(
            target=self._run, name=f"reactor-derived-{name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def put(self, derived: Derived | None) -> None:
        with self._ready:
            self._queue.append(derived)
            self._ready.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end (waits up to ``timeout``)."""
        self.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                derived = self._queue.popleft()
            if derived is None:
                return
            try:
                self._callback(derived)
            except Exception:  # one callback's failure is its own
                logger.exception("a subscriber of derived value %r failed", self._name)


class _Watch:
    """A watch's buffer: the oldest goes when it is full."""

    def __init__(self) -> None:
        self._queue: deque[Derived] = deque(maxlen=WATCH_BUFFER)
        self._ready = threading.Condition()
        self._ended = False

    def put(self, derived: Derived) -> None:
        with self._ready:
            self._queue.append(derived)
            self._ready.notify()

    def end(self) -> None:
        with self._ready:
            self._ended = True
            self._ready.notify()

    def __iter__(self) -> Iterator[Derived]:
        while True:
            with self._ready:
                while not self._queue and not self._ended:
                    self._ready.wait()
                if not self._queue:
                    return
                derived = self._queue.popleft()
            yield derived


def _run_coroutine(awaitable: Any) -> Any:
    """The result of an async function's run, on an event loop of its own: it reads
    through its ``Reader`` (which does not await), on the thread that holds the
    snapshot, not on the application's loop."""
    import asyncio  # only for async functions: most programs never load it

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(awaitable)
    finally:
        loop.close()
