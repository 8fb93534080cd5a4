"""Engines: one per database per process, shared by every handle ``open()`` returns.

An engine owns the store, the scope actors (through their mailboxes), the TTL sweeper
and the statistics. Handles count references; the last one to close stops it all.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ._actor import Mailbox, shard_index
from ._clock import Clock, SystemClock
from ._dispatch import Dispatcher
from ._sqlite import SQLiteStore
from ._stats import EVENT_COUNTERS, Stats
from ._store import ChangeRecord, Store, WriteTxn
from ._values import DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, MAX_DEPTH_LIMIT, encode
from ._writes import Work, expire_keys
from .errors import BusyError, ClosedError, InvalidArgumentError, OperationTimeout, StorageError

if TYPE_CHECKING:  # imported when used: SQLAlchemy for PostgreSQL, asyncio by reactor.aio
    import asyncio

    import sqlalchemy as sa

__all__ = ["Engine", "Options", "acquire_engine"]

logger = logging.getLogger("reactor")
T = TypeVar("T")

DEFAULT_PATH: Final = Path("~/.reactor/state.db")
SWEEP_INTERVAL: Final = 0.25  # seconds between sweeps: expiry events within a second
SWEEP_BATCH: Final = 5000  # keys found due per look; a scope's share goes in one write
COMPACT_INTERVAL: Final = 2.0  # seconds between compactions of the change log
FINISH_TIMEOUT: Final = 5.0  # seconds close() waits, in all, for subscribers to deliver
DURABILITIES: Final = ("normal", "full", "memory")
MAX_TIMEOUT: Final = 1_000_000.0  # seconds (11 days): 2**31 - 1 ms is 24 days


@dataclass(frozen=True)
class Options:
    """The options of ``open``, resolved."""

    durability: str = "normal"
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    max_actors: int = 64
    log_retention: int | None = 100_000
    log_retention_seconds: float | None = None
    timeout: float = 30.0
    clock: Clock = field(default_factory=SystemClock, compare=False)

    def __post_init__(self) -> None:
        if self.durability not in DURABILITIES:
            raise InvalidArgumentError(
                f"durability must be one of {', '.join(DURABILITIES)}, not {self.durability!r}"
            )
        _positive_int("max_value_bytes", self.max_value_bytes)
        _positive_int("max_depth", self.max_depth)
        if self.max_depth > MAX_DEPTH_LIMIT:
            raise InvalidArgumentError(f"max_depth is at most {MAX_DEPTH_LIMIT}")
        _positive_int("max_actors", self.max_actors)
        if self.log_retention is not None:
            _positive_int("log_retention", self.log_retention)
        if self.log_retention_seconds is not None:
            _positive_number("log_retention_seconds", self.log_retention_seconds)
        _positive_number("timeout", self.timeout)
        if self.timeout > MAX_TIMEOUT:  # the drivers take it in milliseconds, as a C int
            raise InvalidArgumentError(f"timeout is at most {MAX_TIMEOUT:,.0f} seconds")
        if not callable(getattr(self.clock, "time", None)):
            raise InvalidArgumentError("clock must have a time() method")


def _positive_int(name: str, value: object) -> None:
    if type(value) is not int or value <= 0:
        raise InvalidArgumentError(f"{name} must be an int > 0, not {value!r}")


def _positive_number(name: str, value: object) -> None:
    if (
        type(value) not in (int, float)
        or not math.isfinite(value)  # type: ignore[arg-type]
        or value <= 0  # type: ignore[operator]
    ):
        raise InvalidArgumentError(f"{name} must be a number > 0, not {value!r}")


def operation_timeout(scope: str, seconds: float, future: Future[Any]) -> OperationTimeout:
    """The error for a request that got no answer in time; withdraws it if it can."""
    withdrawn = future.cancel()
    return OperationTimeout(
        f"scope {scope!r} did not answer within {seconds} s"
        + ("; the write was withdrawn" if withdrawn else "; it may still commit")
    )


class Engine:
    """The shared state of one database in this process."""

    def __init__(self, key: str, location: Path | sa.URL | None, options: Options) -> None:
        self.key = key
        self.options = options
        self.clock = options.clock
        self.stats = Stats()
        self.store = _open_store(location, options)
        self.closed = False
        self._handles = 0
        self._lock = threading.Lock()
        self._mailboxes: list[Mailbox | None] = [None] * options.max_actors
        self._sweeping: dict[str, Future[Any]] = {}  # scope -> its expiry request
        self._sweep_again = threading.Event()
        self.lock_released = threading.Condition()  # wakes lock waiters of this process
        self._stop = threading.Event()
        try:
            self.dispatcher = Dispatcher(key, self.store, self.stats, follow=location is not None)
        except BaseException:
            self.store.close()  # its connections are not left to the garbage collector
            raise
        self._feeds: set[Any] = set()  # subscriptions and watches, to finish at close
        self._sweeper = threading.Thread(
            target=self._sweep_loop, name=f"reactor-sweeper[{key}]", daemon=True
        )
        self._sweeper.start()
        _live_engines.add(self)

    # -- time and values -----------------------------------------------------------
    def now(self) -> float:
        return self.clock.time()

    def encode(self, value: Any) -> str:
        return encode(
            value, max_depth=self.options.max_depth, max_bytes=self.options.max_value_bytes
        )

    # -- writes --------------------------------------------------------------------
    def mailbox(self, scope: str) -> Mailbox:
        index = shard_index(scope, len(self._mailboxes))
        mailbox = self._mailboxes[index]
        if mailbox is None:
            with self._lock:
                if self.closed:
                    raise ClosedError("the engine is closed")
                mailbox = self._mailboxes[index]
                if mailbox is None:
                    mailbox = Mailbox(f"{self.key}#{index}", self.store, self.now, self._on_commit)
                    self._mailboxes[index] = mailbox
        return mailbox

    def write(self, scope: str, work: Work[T]) -> T:
        """Run ``work`` on the actor that owns ``scope``; wait for its commit.

        Raises:
            OperationTimeout: no answer within the engine's timeout.
        """
        return self.mailbox(scope).call(work, scope, lambda future: self.wait(scope, future))

    def wait(self, scope: str, future: Future[T]) -> T:
        """The result of a request to ``scope``'s actor, within the engine's timeout
        counted from the request, or from the scope's last hand-over if later: a
        request queued behind transactions that take the scope in turn waits as long as
        they move on (see ``Mailbox.moved``).

        Raises:
            OperationTimeout: no answer in time (the request is withdrawn if it can be).
        """
        timeout = self.options.timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                return future.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                mailbox = self._mailboxes[shard_index(scope, len(self._mailboxes))]
                moved = None if mailbox is None else mailbox.moved(scope)
                if moved is None or moved + timeout <= deadline:
                    raise operation_timeout(scope, timeout, future) from None
                deadline = moved + timeout

    def _on_commit(self, records: list[ChangeRecord]) -> None:
        """Called right after each commit, in revision order (under the write gate)."""
        expired = sum(1 for record in records if record.type == "expired")
        if expired:
            self.stats.count("keys_expired", expired)
        self.dispatcher.committed(records)

    # -- subscriptions -------------------------------------------------------------
    def track(self, feed: Any) -> None:
        """Take on a subscription or watch (finished at close).

        Raises:
            ClosedError: the engine is closed.
            InvalidArgumentError: a durable name already subscribed in this process.
        """
        with self._lock:
            if self.closed:
                raise ClosedError("the engine is closed")
            durable = getattr(feed, "durable", None)
            if durable is not None and any(
                getattr(other, "durable", None) == durable for other in self._feeds
            ):
                raise InvalidArgumentError(
                    f"durable subscriber {durable!r} is already subscribed in this process"
                )
            self._feeds.add(feed)

    def durable_in_use(self, name: str) -> bool:
        with self._lock:
            return any(getattr(feed, "durable", None) == name for feed in self._feeds)

    def forget(self, feed: Any) -> None:
        with self._lock:
            self._feeds.discard(feed)

    # -- expiry --------------------------------------------------------------------
    def _sweep_loop(self) -> None:
        checkpointed = compacted = time.monotonic()
        failures = 0
        while not self._stop.is_set():
            self._sweep_again.wait(SWEEP_INTERVAL)
            self._sweep_again.clear()
            if self._stop.is_set():
                return
            try:
                self.sweep()
                now = time.monotonic()
                if now - checkpointed >= SWEEP_INTERVAL:
                    checkpointed = now
                    self.store.checkpoint()
                if now - compacted >= COMPACT_INTERVAL:
                    compacted = now
                    self.compact()
                failures = 0
            except ClosedError:
                return
            except Exception:
                failures += 1
                if failures == 1 or failures % 240 == 0:  # once, then about once a minute
                    logger.exception(
                        "the background sweeper failed (%d times in a row); it will try again",
                        failures,
                    )
                self._stop.wait(SWEEP_INTERVAL)

    def compact(self) -> int:
        """Drop the change-log records beyond the retention policy; return how many."""
        keep, seconds = self.options.log_retention, self.options.log_retention_seconds

        def work(txn: WriteTxn) -> int:
            # Never the newest record: the next revision follows it (see _schema.changes).
            upto = None if keep is None else txn.statements.current_revision() - keep
            before = None if seconds is None else txn.now - seconds
            if upto is not None and upto <= 0:
                upto = None
            return txn.statements.compact(upto, before) if upto or before else 0

        removed, _ = self.store.write(work, self.now())
        if removed:
            logger.debug("compacted %d change-log records of %s", removed, self.key)
        return removed

    def sweep(self) -> None:
        """Send the actors the keys whose deadline has passed: one request per scope,
        and none for a scope whose previous request is still in flight (held up by a
        transaction, say), so that other scopes' keys still expire on time."""
        with self._lock:
            busy = list(self._sweeping)
        due = self.store.expired(self.now(), SWEEP_BATCH, skip=busy)
        more = len(due) == SWEEP_BATCH  # more may be due: look again once these are done
        by_scope: dict[str, list[str]] = {}
        for scope, key in due:
            by_scope.setdefault(scope, []).append(key)
        for scope, keys in by_scope.items():
            future = self.mailbox(scope).submit(expire_keys(scope, keys), scope)
            with self._lock:
                self._sweeping[scope] = future
            future.add_done_callback(functools.partial(self._swept, scope, more=more))

    def _swept(self, scope: str, future: Future[Any], *, more: bool) -> None:
        with self._lock:
            if self._sweeping.get(scope) is future:
                del self._sweeping[scope]
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                logger.warning("expiring keys of %r failed: %s", scope, future.exception())
            return
        if more:
            self._sweep_again.set()  # no need to wait for the next round

    # -- lifetime ------------------------------------------------------------------
    def attach(self) -> bool:
        """Count one more handle; False if the engine is closed or closing. Called
        under the registry's lock."""
        with self._lock:
            if self.closed:
                return False
            self._handles += 1
            return True

    def detach(self) -> None:
        """Forget one handle; the last one closes the engine.

        The count and the registry change together, under the registry's lock: an
        ``open()`` either joins this engine before its last handle goes, or finds it
        gone from the registry and starts another once this one has closed
        (``acquire_engine``); never one that is closing.
        """
        with _registry_lock:
            with self._lock:
                self._handles -= 1
                last = self._handles == 0
            if not last:
                return
            if _registry.get(self.key) is self:
                del _registry[self.key]
            closing = _Closing(self, threading.get_ident())
            _closing[self.key] = closing
        try:
            self.close()
        finally:
            with _registry_lock:
                if _closing.get(self.key) is closing:
                    del _closing[self.key]
            closing.done.set()

    def close(self) -> None:
        """Finish queued writes, stop the actors and the sweeper, release the database."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        _forget(self)
        self._stop.set()
        self._sweep_again.set()
        with self.lock_released:
            self.lock_released.notify_all()  # waiters wake up to ClosedError
        if self._sweeper is not threading.current_thread():
            self._sweeper.join(self.options.timeout)
        for mailbox in self._mailboxes:
            if mailbox is not None:
                mailbox.close(self.options.timeout)
        # What is pending is delivered within one bounded wait, however many subscribers
        # are stuck: the dispatcher hands on what it holds, every feed is told to finish,
        # then each is waited for until the one deadline.
        deadline = time.monotonic() + FINISH_TIMEOUT
        self.dispatcher.close(FINISH_TIMEOUT)
        with self._lock:
            feeds, self._feeds = list(self._feeds), set()
        loop = _running_loop()
        for feed in feeds:
            feed.finish(loop)
        for feed in feeds:
            feed.join(max(0.0, deadline - time.monotonic()))
        self.store.close()
        logger.debug("closed engine %s", self.key)

    def stats_snapshot(self) -> dict[str, Any]:
        counts = self.store.counts(self.now())
        revision = self.store.revision()
        recorded = self.stats.snapshot()
        counters = recorded["counters"]
        return {
            "database": self.store.location,
            "database_bytes": self.store.size_bytes(),
            "scopes": counts,
            "keys": sum(counts.values()),
            "operations": recorded["operations"],
            "events": {name: counters.get(f"events_{name}", 0) for name in EVENT_COUNTERS},
            "keys_expired": counters.get("keys_expired", 0),
            "locks_held": self.store.locks_held(self.now()),
            "actors": sum(1 for mailbox in self._mailboxes if mailbox is not None),
            "latency_ms": recorded["latency_ms"],
            "durable_subscribers": {
                name: {
                    "position": position,
                    "lag": max(0, revision - position),
                    "delivered": delivered,
                    "failed": failed,
                }
                for name, (position, delivered, failed) in self.store.subscribers().items()
            },
            "revision": revision,
        }


def _running_loop() -> asyncio.AbstractEventLoop | None:
    if "asyncio" not in sys.modules:  # no loop runs in a process that never imported it
        return None
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# -- the registry: one engine per database per process ------------------------------
# A database's engine is in _registry while it runs. While one thread starts it, its
# key is in _opening (other threads wait for it). Once its last handle has closed, it
# is in _closing until its close() returns: a new engine for the key waits for that
# (within the timeout), so that one database does not get two sets of actors, nor a
# durable subscriber two deliverers, in one process.


@dataclass(eq=False)
class _Closing:
    engine: Engine
    thread: int  # the thread closing it: it must not wait for itself
    done: threading.Event = field(default_factory=threading.Event)


_registry: dict[str, Engine] = {}
_opening: dict[str, threading.Event] = {}
_closing: dict[str, _Closing] = {}
_registry_lock = threading.Lock()
_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget(engine: Engine) -> None:
    with _registry_lock:
        if _registry.get(engine.key) is engine:
            del _registry[engine.key]
        _live_engines.discard(engine)


def _usable(engine: Engine) -> bool:
    """Whether a registered engine can take another handle: not closed, and (SQLite)
    its file still at its path. An engine whose file was removed or replaced fails
    every write; a new ``open()`` gets a new engine on what is there now, and the old
    engine's WAL is taken off the path first, or the new one would read it."""
    if engine.closed:
        return False
    if isinstance(engine.store, SQLiteStore) and engine.store.moved():
        engine.store.leave_path()
        return False
    return True


def _open_store(location: Path | sa.URL | None, options: Options) -> Store:
    if location is None or isinstance(location, Path):
        return SQLiteStore(location, durability=options.durability, timeout=options.timeout)
    from ._postgres import PostgresStore  # SQLAlchemy and psycopg: only for PostgreSQL

    return PostgresStore(location, durability=options.durability, timeout=options.timeout)


def locate(
    target: str | os.PathLike[str] | None, durability: str
) -> tuple[str | None, Path | sa.URL | None]:
    """The registry key and location (a file path, a PostgreSQL URL, or None in memory)
    for what ``open`` was given. The key is None for a private in-memory database.
    """
    if target is None:
        target = os.environ.get("REACTOR_DB") or DEFAULT_PATH
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str) or not target:
        raise InvalidArgumentError(f"open() takes a path or URL, not {target!r}")
    if target in (":memory:", "sqlite://", "sqlite:///:memory:"):
        return None, None
    if target.startswith(":memory:"):
        return f"memory:{target[len(':memory:') :]}", None
    if "://" in target:
        scheme, _, rest = target.partition("://")
        if scheme.partition("+")[0] in ("postgresql", "postgres"):
            from ._postgres import normalize_url

            url = normalize_url(target)
            return f"postgresql:{url.render_as_string(hide_password=True)}", url
        if scheme not in ("sqlite", "sqlite+pysqlite"):
            raise InvalidArgumentError(
                f"unsupported database URL scheme {scheme!r}: use a file path, "
                "':memory:', a sqlite:/// URL or a postgresql+psycopg:// URL"
            )
        if not rest.startswith("/"):
            raise InvalidArgumentError(f"a sqlite URL needs three slashes: {target!r}")
        target = rest[1:].partition("?")[0]
        if target in ("", ":memory:"):
            return None, None
    path = _file_path(target)
    if durability == "memory":
        return f"memory-file:{path}", None
    return f"file:{os.path.realpath(path)}", path


def _file_path(target: str) -> Path:
    """The absolute path of a SQLite database file.

    Raises:
        InvalidArgumentError: it holds NUL, or is not valid UTF-8 (SQLite cannot name it).
        StorageError: it starts with ``~`` and there is no home folder.
    """
    if "\x00" in target:
        raise InvalidArgumentError(f"a database path cannot hold a NUL character: {target!r}")
    try:
        target.encode()
    except UnicodeEncodeError:
        # A file name that is not UTF-8 (os.fsdecode's surrogates): SQLite cannot name it.
        raise InvalidArgumentError(
            f"a database path must be valid UTF-8 for SQLite: {target!r}"
        ) from None
    try:
        return Path(target).expanduser().absolute()
    except RuntimeError as exc:  # "~" with neither $HOME nor a passwd entry
        raise StorageError(
            f"cannot find the home folder for {target!r} (set HOME, or REACTOR_DB)"
        ) from exc


def acquire_engine(target: str | os.PathLike[str] | None, given: dict[str, Any]) -> Engine:
    """The engine for ``target``, started if need be, with one more handle attached.

    An engine whose last handle is closing is never joined: this waits for it to
    finish closing (within the timeout) and starts another. Engines start outside the
    registry's lock: opening one database does not hold up opening or closing others.

    Raises:
        InvalidArgumentError: an option is out of range, or differs from the options the
            running engine for this database was opened with.
        StorageError: the database cannot be opened (or its folder made).
        BusyError: another thread of this process kept starting it past the timeout.
    """
    options = Options(**given)
    key, location = locate(target, options.durability)
    if key is None:  # private: nobody to share it with
        private = _start(f"memory#{id(options)}", location, options)
        private.attach()
        return private
    deadline = time.monotonic() + options.timeout
    while True:
        with _registry_lock:
            engine = _registry.get(key)
            if engine is not None and _usable(engine):
                _check_options(target, engine, given)
                if engine.attach():
                    return engine
            wait = _opening.get(key)
            closing = _closing.get(key)
            if wait is None and closing is not None and closing.thread != threading.get_ident():
                wait = closing.done
            if wait is None or time.monotonic() >= deadline:
                if wait is not None and key in _opening:
                    raise BusyError(
                        f"another thread kept opening {target!s} for more than {options.timeout} s"
                    )
                started = _opening[key] = threading.Event()
                break
        wait.wait(max(0.0, deadline - time.monotonic()))
    engine = None
    try:
        engine = _start(key, location, options)
    finally:
        with _registry_lock:
            del _opening[key]
            if engine is not None:  # (None: it failed)
                _registry[key] = engine
                engine.attach()
        started.set()
    return engine


def _check_options(target: object, engine: Engine, given: dict[str, Any]) -> None:
    for item in fields(Options):
        if item.name in given and getattr(engine.options, item.name) != given[item.name]:
            raise InvalidArgumentError(
                f"{target!s} is already open in this process with "
                f"{item.name}={getattr(engine.options, item.name)!r}"
            )


def _start(key: str, location: Path | sa.URL | None, options: Options) -> Engine:
    """A new engine (the default folder made private first).

    Raises:
        StorageError: the folder cannot be made, or the database opened.
    """
    if isinstance(location, Path) and location.parent == _default_folder():
        try:
            location.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder of {location}: {exc}") from exc
    return Engine(key, location, options)


def _default_folder() -> Path | None:
    try:
        return DEFAULT_PATH.expanduser().parent
    except RuntimeError:  # no home folder: the default path is not in use either
        return None


@atexit.register
def _close_all() -> None:
    for engine in list(_live_engines):
        try:
            engine.close()
        except Exception:
            logger.exception("closing %s at exit failed", engine.key)
