"""The verbs every synchronous scope handle shares (``Scope``, ``Transaction``).

Each write verb is defined once, in ``_writes``: its checks (run here, in the caller's
thread) and its work. A handle only says how work runs (``_run``): ``Scope`` on the
actor that owns the scope, ``Transaction`` in its own pending transaction. Their
asyncio twins are ``reactor.aio.verbs.AsyncVerbs``, over the same work and one hook.

Each read verb is defined once, here: a handle only says where it reads its rows
(``_text``, ``_entry``, ``_texts``, ``_items``, ``_keys``): ``Scope`` the last commit,
straight on the database; ``Transaction`` its pending transaction, as its body has
changed it. ``AsyncScope`` and ``AsyncTransaction`` run these in a worker thread.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from reactor._base.codecs import Codec, default_codec
from reactor._base.keys import Pattern, check_key, compile_pattern
from reactor._base.results import Change, Entry, Timer, UpdateResult
from reactor._base.values import MISSING, Number, decode
from reactor._engine.events import ChangeEvent
from reactor._engine.options import Options, with_codec
from reactor._storage.records import Row
from reactor._work import timers as _timers
from reactor._work import writes as _writes
from reactor._work.writes import Work, check_revision, check_ttl
from reactor.errors import InvalidArgumentError, RevisionCompactedError, TypeMismatchError

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["ScopeVerbs", "check_ttl", "verb"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
D = TypeVar("D")
V = TypeVar("V", bound="ScopeVerbs")


def verb(
    name: str, *, write: bool = False
) -> Callable[[Callable[Concatenate[V, P], R]], Callable[Concatenate[V, P], R]]:
    """Check the handle may be used (``write``: may write, before any argument is looked
    at), and count the call for ``stats()`` (timing a sample of them)."""

    def decorate(method: Callable[Concatenate[V, P], R]) -> Callable[Concatenate[V, P], R]:
        def timed(self: V, /, *args: P.args, **kwargs: P.kwargs) -> R:
            engine = self._writable() if write else self._usable()
            stats = engine.stats
            if not stats.timing(name):  # counted, not timed (Stats.timing)
                return method(self, *args, **kwargs)
            start = perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                stats.sample(name, perf_counter() - start)

        functools.update_wrapper(timed, method)
        return timed

    return decorate


# Public (reactor.ScopeVerbs): mypy names the class that defines a method in its
# messages ('"set" of "ScopeVerbs"'), so users meet this name and can look it up.
class ScopeVerbs:
    """The verbs ``Scope`` and ``Transaction`` share (SPEC §3, and ``update``, SPEC
    §4), and their type: annotate with it code that reads or writes through either.
    Not created directly; the verbs are documented with ``Scope``."""

    __slots__ = ()

    name: str
    """The scope's name."""

    def _usable(self) -> EnginePort:
        """The engine, once this handle is known to be usable (else raise)."""
        raise NotImplementedError

    def _writable(self) -> EnginePort:
        """The engine, once this handle is known to be usable for writes (else raise)."""
        return self._usable()

    @property
    def _engine(self) -> EnginePort:
        return self._usable()

    _codec: Codec | None
    """The handle's codec (its scope's, else its state's), or None: strict JSON."""

    @property
    def _options(self) -> Options:
        """What writes check and encode with: the engine's options, with the codec."""
        options = self._engine.options
        codec = self._codec
        return options if codec is None else with_codec(options, codec)

    def _run(self, work: Work[T]) -> T:
        raise NotImplementedError

    # -- where reads read: each handle's own ----------------------------------------
    def _text(self, key: str) -> str | None:
        """The JSON text of live ``key``, or None."""
        raise NotImplementedError

    def _entry(self, key: str, now: float) -> tuple[str, float | None] | None:
        """The JSON text and deadline of live ``key``, or None."""
        raise NotImplementedError

    def _texts(self, keys: builtins.list[str]) -> dict[str, str]:
        """The JSON texts of those of ``keys`` that are live, in the order asked."""
        raise NotImplementedError

    def _items(self, pattern: Pattern) -> builtins.list[tuple[str, str]]:
        """The live keys matching ``pattern`` and their JSON texts, sorted by key."""
        raise NotImplementedError

    def _keys(self, pattern: Pattern) -> builtins.list[str]:
        """The live keys matching ``pattern``, sorted."""
        return [key for key, _ in self._items(pattern)]

    def _row(self, key: str) -> Row | None:
        """The row of live ``key`` (its revisions and version), or None."""
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    # -- reads ---------------------------------------------------------------------
    @overload
    def get(self, key: str, default: Any = None, *, at_revision: int | None = None) -> Any: ...

    @overload
    def get(
        self, key: str, *, at_revision: int | None = None, type: builtins.type[T]
    ) -> T | None: ...

    @overload
    def get(
        self, key: str, default: D, *, at_revision: int | None = None, type: builtins.type[T]
    ) -> T | D: ...

    # mypy does not see an implementation's signature through a ParamSpec decorator
    # (``verb`` keeps it whole): the overloads above are the checked ones.
    @verb("get")  # type: ignore[misc]
    def get(
        self,
        key: str,
        default: Any = None,
        *,
        at_revision: int | None = None,
        type: Any = None,  # noqa: A002 - the name redis-om and msgspec users know
    ) -> Any:
        """The value of ``key`` (a fresh copy), or ``default`` if it is absent.

        ``at_revision=R``: the value it had at revision ``R`` (``default`` if absent
        then), from the change log (in a transaction: as committed, not as the body
        changed it).

        ``type=Order``: the value decoded as an ``Order`` (a dataclass, a pydantic model,
        ``datetime``, ``list[Order]``...) by the handle's codec (else a
        ``reactor.codecs.TypedCodec``); ``default`` is returned as it is.

        Raises:
            InvalidArgumentError: ``at_revision`` is not a revision, or is after the last.
            RevisionCompactedError: the change log no longer covers ``at_revision``.
            TypeMismatchError: the value does not fit ``type``.
        """
        checked = check_key(key)
        if at_revision is None:
            text = self._text(checked)
        else:
            revision = check_revision(at_revision, "at_revision")
            text = self._engine.store.value_at(self.name, checked, revision)
        if text is None:
            return default
        return decode(text) if type is None else self._typed(decode(text), type, checked)

    def _typed(self, value: Any, kind: Any, key: str) -> Any:
        """``value`` (of ``key``) decoded as ``kind`` by the handle's codec.

        Raises:
            TypeMismatchError: it does not fit.
        """
        codec = self._codec or default_codec()
        try:
            return codec.decode(value, kind)
        except TypeMismatchError as exc:
            raise TypeMismatchError(f"{key!r} in scope {self.name!r}: {exc}") from None

    @verb("entry")
    def entry(self, key: str) -> Entry | None:
        """The value of live ``key`` with its ``revision`` (of its last change),
        ``created_revision``, ``version`` (1 at creation, +1 per change) and
        ``expires_at`` (epoch seconds, or None); None when it is absent.

        In a transaction, a key the body changed shows ``revision`` below zero until
        the commit gives it one.
        """
        row = self._row(check_key(key))
        if row is None:
            return None
        return Entry(
            decode(row.value), row.revision, row.created_revision, row.version, row.expires_at
        )

    @verb("history")
    def history(
        self, key: str, since: int | None = None, limit: int | None = None
    ) -> builtins.list[ChangeEvent]:
        """The change log's events of ``key`` after revision ``since`` (every one it
        retains when None), oldest first; at most ``limit`` of them. In a transaction:
        those committed, not the body's own.

        Raises:
            InvalidArgumentError: ``since`` or ``limit`` is not an int >= 0.
            RevisionCompactedError: the change log no longer holds what follows ``since``
                (also when compaction overtakes the read).
        """
        checked = check_key(key)
        store = self._engine.store
        position = 0 if since is None else check_revision(since, "since")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(f"limit must be an int >= 0, not {limit!r}")
        while True:
            horizon = store.compacted()
            found: builtins.list[ChangeEvent] = []
            after = position
            while limit is None or len(found) < limit:
                page = 1000 if limit is None else min(1000, limit - len(found))
                records = store.key_history(self.name, checked, after, page)
                found.extend(ChangeEvent(record) for record in records)
                if len(records) < page:
                    break
                after = records[-1].revision
            compacted = store.compacted()  # read after: a compaction meanwhile shows
            if since is not None and since < compacted:
                raise RevisionCompactedError(
                    f"the change log holds the events after revision {compacted}, not after {since}"
                )
            if since is not None or compacted == horizon:
                return found
            # Compacted while read: a page after the first may begin past a gap. Every
            # retained event is what was asked for: read them again.

    @verb("get_many")
    def get_many(
        self,
        keys: Iterable[str],
        *,
        type: Any = None,  # noqa: A002 - as get's
    ) -> dict[str, Any]:
        """The values of those of ``keys`` that exist, in the order asked; each decoded
        as ``type`` if given (as ``get``)."""
        if isinstance(keys, str) or not isinstance(keys, Iterable):
            raise InvalidArgumentError(
                f"get_many takes an iterable of keys, not {builtins.type(keys).__name__}"
            )
        found = self._texts([check_key(key) for key in keys])
        if type is None:
            return {key: decode(text) for key, text in found.items()}
        return {key: self._typed(decode(text), type, key) for key, text in found.items()}

    @verb("exists")
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a live value."""
        return self._text(check_key(key)) is not None

    @verb("list")
    def list(self, *, type: Any = None) -> dict[str, Any]:  # noqa: A002 - as get's
        """Every live key and its value, sorted by key; each value decoded as ``type``
        if given (as ``get``)."""
        items = self._items(compile_pattern("*"))
        if type is None:
            return {key: decode(text) for key, text in items}
        return {key: self._typed(decode(text), type, key) for key, text in items}

    @verb("keys")
    def keys(self, pattern: str = "*") -> builtins.list[str]:
        """The live keys matching the glob ``pattern``, sorted."""
        return self._keys(compile_pattern(pattern))

    @verb("ttl")
    def ttl(self, key: str) -> float:
        """Seconds left before ``key`` expires; ``-1`` without expiry, ``-2`` if absent."""
        checked = check_key(key)
        now = self._now()
        entry = self._entry(checked, now)
        if entry is None:
            return -2.0
        expires_at = entry[1]
        return -1.0 if expires_at is None else expires_at - now

    @verb("length")
    def length(self, key: str) -> int:
        """The length of the list at ``key``; 0 when it is absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        text = self._text(check_key(key))
        if text is None:
            return 0
        value = decode(text)
        if type(value) is not builtins.list:
            raise TypeMismatchError(f"length needs a list; {key!r} holds {type(value).__name__}")
        return len(value)

    # -- timers --------------------------------------------------------------------
    @verb("schedule", write=True)
    def schedule(
        self,
        key: str,
        value: Any = MISSING,
        *,
        after: float | None = None,
        at: float | None = None,
        every: float | None = None,
        ops: builtins.list[dict[str, Any]] | None = None,
        cron: str | None = None,
        tz: str | None = None,
    ) -> Timer:
        """Schedule a write to ``key``: ``value`` (as ``set``), or ``ops`` (as
        ``update``), due ``after`` seconds from now or ``at`` an epoch time (with
        neither, one period from now), and again every ``every`` seconds if given.
        Or, with ``cron`` (five fields: ``"0 9 * * MON-FRI"``), at each time the
        expression names in the IANA zone ``tz`` (UTC if not given), local wall-clock
        times across DST changes.

        When due, the write is applied once, by one process, as an ordinary write; its
        event's ``timer`` is the timer's id. In a transaction the timer is created with
        the commit, or not at all. See ``State.timers`` and ``State.cancel_timer``.

        Raises:
            InvalidArgumentError: not exactly one of ``value`` and ``ops``; both
                ``after`` and ``at``, or no time at all; a bad number; a bad cron
                expression or zone, ``cron`` with another time, ``tz`` without it.
            InvalidValueError: ``value`` is not storable.
            InvalidOpError: ``ops`` are not update ops nor a JSON Patch.
        """
        options = self._options
        return self._run(
            _timers.schedule(
                options, self.name, key, value, ops, after, at, every, cron=cron, tz=tz
            )
        )

    # -- writes --------------------------------------------------------------------
    @verb("set", write=True)
    def set(
        self,
        key: str,
        value: Any,
        ttl: float | None = None,
        keep_ttl: bool = False,
        *,
        if_revision: int | None = None,
    ) -> Change:
        """Store ``value`` at ``key``; return the old and new value.

        Without ``ttl`` the key has no expiry, unless ``keep_ttl`` keeps the one it had.

        ``if_revision=R`` (on every write verb): write only if the key is at revision
        ``R`` (``entry(key).revision``; 0: only if it does not exist).

        Raises:
            InvalidArgumentError: ``ttl`` is not a number > 0, or ``keep_ttl`` not a bool.
            ConflictError: ``if_revision`` does not match; nothing is written.
        """
        # The property inline where no codec applies: every set comes here.
        options = self._engine.options if self._codec is None else self._options
        return self._run(
            _writes.set_value(options, self.name, key, value, ttl, keep_ttl, if_revision)
        )

    @verb("set_many", write=True)
    def set_many(
        self,
        mapping: Mapping[str, Any],
        ttl: float | None = None,
        *,
        if_revision: int | None = None,
    ) -> dict[str, Change]:
        """Store every key-value of ``mapping`` in one write: all or nothing.

        ``if_revision=R``: only if none of the keys changed after revision ``R`` (a
        snapshot's, say; 0: only if none of them exists), else ``ConflictError``.
        """
        work = _writes.set_many(self._options, self.name, mapping, ttl, if_revision)
        return {} if work is None else self._run(work)

    @verb("delete", write=True)
    def delete(self, key: str, *, if_revision: int | None = None) -> Any:
        """Remove ``key``; return its old value, or None if it was absent."""
        return self._run(_writes.delete(self.name, key, if_revision))

    @verb("clear", write=True)
    def clear(self, pattern: str = "*", *, if_revision: int | None = None) -> int:
        """Remove every key matching the glob ``pattern``; return how many.

        ``if_revision=R``: only if no key matching it changed after revision ``R``.
        """
        return self._run(_writes.clear(self.name, pattern, if_revision))

    @verb("expire", write=True)
    def expire(self, key: str, seconds: float | None, *, if_revision: int | None = None) -> bool:
        """Give ``key`` a new expiry; return whether it existed.

        ``None`` removes the expiry; ``seconds <= 0`` expires the key now.
        """
        return self._run(_writes.expire(self.name, key, seconds, if_revision))

    @verb("increment", write=True)
    def increment(
        self, key: str, by: Number = 1, default: Number = 0, *, if_revision: int | None = None
    ) -> Number:
        """Add ``by`` to the number at ``key`` (``default`` when absent); return the result.

        Raises:
            TypeMismatchError: the value, ``by`` or ``default`` is not a number.
        """
        options = self._engine.options  # a number: no codec applies
        return self._run(_writes.increment(options, self.name, key, by, default, if_revision))

    @verb("decrement", write=True)
    def decrement(
        self, key: str, by: Number = 1, default: Number = 0, *, if_revision: int | None = None
    ) -> Number:
        """Subtract ``by`` from the number at ``key``; return the result."""
        options = self._engine.options  # a number: no codec applies
        return self._run(
            _writes.increment(options, self.name, key, by, default, if_revision, down=True)
        )

    @verb("append", write=True)
    def append(self, key: str, text: str, *, if_revision: int | None = None) -> int:
        """Append ``text`` to the string at ``key`` (``""`` when absent); return its length.

        Raises:
            TypeMismatchError: the value or ``text`` is not a string.
        """
        options = self._options
        return self._run(_writes.append_text(options, self.name, key, text, if_revision))

    @verb("compare_and_swap", write=True)
    def compare_and_swap(
        self, key: str, expected: Any, new: Any, *, if_revision: int | None = None
    ) -> bool:
        """Set ``key`` to ``new`` only if it holds ``expected``; return whether it did.

        Equality is JSON's (``1 == 1.0``, ``True != 1``). ``expected=MISSING`` means the
        key must not exist; ``new=MISSING`` deletes it. The expiry is kept.
        """
        options = self._options
        return self._run(
            _writes.compare_and_swap(options, self.name, key, expected, new, if_revision)
        )

    @verb("push", write=True)
    def push(self, key: str, *items: Any, if_revision: int | None = None) -> int:
        """Append ``items`` to the list at ``key`` (``[]`` when absent); return its length.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        options = self._options
        return self._run(_writes.push(options, self.name, key, items, if_revision))

    @verb("pop", write=True)
    def pop(self, key: str, front: bool = False, *, if_revision: int | None = None) -> Any:
        """Remove and return the last item of the list at ``key`` (the first with
        ``front=True``); None when the list is empty or absent.

        Raises:
            TypeMismatchError: the value is not a list.
        """
        return self._run(_writes.pop(self.name, key, front, if_revision))

    @verb("update", write=True)
    def update(
        self,
        key: str,
        ops: builtins.list[dict[str, Any]],
        atomic: bool | None = None,
        *,
        if_revision: int | None = None,
    ) -> UpdateResult:
        """Apply ``ops`` to the value at ``key`` in one write (SPEC §4).

        ``ops`` are update ops (``{"type": ...}``, see ``reactor.ops``), applied in order,
        an op that cannot apply being skipped and reported (all or nothing with
        ``atomic=True``); or a JSON Patch (``{"op": ...}``, RFC 6902), all or nothing.

        Raises:
            InvalidOpError: ``ops`` is not a list of dicts, or mixes the two styles.
            InvalidValueError: a value in the ops, or the resulting value, is not storable.
            InvalidArgumentError: ``atomic`` is not None or a bool, or is False with a
                JSON Patch.
        """
        options = self._options
        return self._run(_writes.update(options, self.name, key, ops, atomic, if_revision))
