"""``Aggregate``: ``state.count`` and ``state.sum`` (SPEC §15), derived values kept up
from each change's old and new value rather than by reading the scope again.

It is built from a snapshot (when made, and whenever it cannot go on from the changes:
a function that raised on one, a change it may have missed), then each change of a
matching key after the snapshot's revision adds what its new value counts and takes
off what its old one did. Changes offered while it is being built wait, and those after
the snapshot are applied once it is: none is counted twice, none is lost.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

import jsonpointer

from reactor._base.keys import Pattern, check_key, compile_pattern
from reactor._base.values import decode
from reactor._engine.events import ChangeEvent
from reactor._storage.records import ChangeRecord
from reactor.errors import ClosedError, InvalidArgumentError

from .derived import DerivedValue
from .reader import Reader, ReadSet

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["Aggregate"]

Number = int | float
Part = tuple[int | Fraction, bool]  # what a key adds, and whether it is a float
_NOTHING: Final[Part] = (0, False)


class Aggregate(DerivedValue):
    """A count (``path`` None) or a sum of the values of ``scope``'s keys that match
    ``pattern`` (and ``where``, if given)."""

    def __init__(
        self,
        binding: Binding,
        name: str,
        scope: str,
        pattern: str,
        where: Callable[[Any], bool] | None,
        path: str | None,
    ) -> None:
        if where is not None and not callable(where):
            raise InvalidArgumentError(f"where must be callable, not {where!r}")
        self._scope = check_key(scope, "scope name")
        self._pattern: Pattern = compile_pattern(pattern)
        self._where = where
        try:
            self._pointer = None if path is None else jsonpointer.JsonPointer(path)
        except jsonpointer.JsonPointerException as exc:
            raise InvalidArgumentError(f"path {path!r} is not a JSON Pointer: {exc}") from None
        super().__init__(binding, self._from_snapshot, name, None)
        self._state = threading.Lock()
        self._total: int | Fraction = 0
        self._applied = 0  # the revision the total is as of
        self._rebuild = True  # build it from a snapshot at the next refresh
        self._building = False  # a build is under way: changes wait
        self._waiting: list[tuple[int, ChangeRecord]] = []  # batch, change
        self._floats = 0  # how many keys add a float: the total is published as one
        self._uncounted: set[str] = set()  # keys past their deadline at the build

    # -- what one value counts ------------------------------------------------------------
    def _part(self, text: str | None) -> Part:
        """What a key holding JSON ``text`` adds (None: absent, adds nothing; "null"
        is a value, and counts): 1 or its number (exact: a float as the fraction it
        is, so that adding and taking off leaves no rounding behind), and whether that
        number is a float."""
        if text is None:
            return _NOTHING
        value = decode(text)
        if self._where is not None and not self._where(value):
            return _NOTHING
        if self._pointer is None:
            return 1, False
        found = self._pointer.resolve(value, None)
        if isinstance(found, bool) or not isinstance(found, int | float):
            return _NOTHING  # no number there: it adds nothing
        if isinstance(found, float):
            return Fraction(found), True
        return found, False

    def _add(self, text: str | None, sign: int) -> None:
        """Add (``sign`` 1) or take off (-1) what ``text`` adds (the state's lock held)."""
        amount, is_float = self._part(text)
        self._total += sign * amount
        self._floats += sign * int(is_float)

    def _from_snapshot(self, reader: Reader) -> None:
        """The total of the live keys; a key past its deadline that no sweep took off
        yet is left out, and its expiry (the change still to come) takes nothing off."""
        self._total, self._floats = 0, 0
        self._uncounted = set()
        for key, row in reader.stored_rows(self._scope, self._pattern):
            if row.live(reader.now):
                self._add(row.value, 1)
            else:
                self._uncounted.add(key)

    def _published_total(self) -> Number:
        """The total as published: a float if a float is in it, else an int."""
        total = self._total
        if self._floats:
            return float(total)
        return int(total)

    # -- keeping it up --------------------------------------------------------------------
    def follows(self, record: ChangeRecord, event: ChangeEvent) -> bool:  # noqa: ARG002 - DerivedValue's call
        """Keep the change (on the dispatcher's thread) until its batch is over: then
        whole commits are applied (``settle``)."""
        with self._state:
            self._waiting.append((self._registry.batch, record))
        return True

    def settle(self) -> None:
        """Apply the changes kept (on the dispatcher's thread, between batches: whole
        commits); not while a build is under way (it applies them)."""
        with self._state:
            if not self._building and not self._rebuild:
                self._apply(self._registry.batch)

    def _apply(self, ended: int) -> None:
        """Apply the changes kept of batches before ``ended`` that came after the total
        (with the state's lock held); one that ``where`` fails on has it built again."""
        kept: list[tuple[int, ChangeRecord]] = []
        for batch, record in self._waiting:
            if batch >= ended:
                kept.append((batch, record))
            elif record.revision > self._applied and not self._rebuild:
                try:
                    self._add(record.new_value, 1)
                    if record.key in self._uncounted:  # its old value was never counted
                        self._uncounted.discard(record.key)
                    else:
                        self._add(record.old_value, -1)
                except Exception as exc:  # noqa: BLE001 - ``where``'s: kept, built again
                    self._rebuild = True
                    self.error = exc
                    continue
                self._applied = record.revision
        self._waiting = kept

    def missed(self) -> None:
        with self._state:
            self._rebuild = True
        super().missed()

    def refresh(self) -> None:
        with self._computing, contextlib.suppress(ClosedError):  # closed meanwhile
            with self._state:
                rebuild, self._rebuild = self._rebuild, False
                self._building = rebuild
            if rebuild and not self._build():
                return
            with self._state:  # as of its revision, whatever is due next (a build)
                total, revision = self._published_total(), self._applied
            self._offer(total, revision)

    def _build(self) -> bool:
        """Build the total from a snapshot, then apply the changes kept of the batches
        over that came after it; whether it could be built."""
        engine = self._binding.engine
        read = ReadSet(patterns={self._scope: {self._pattern.text: self._pattern}})
        try:
            with engine.store.consistent_reads() as snapshot:
                reader = Reader(snapshot, engine.now())
                with self._state:
                    self._from_snapshot(reader)
                    self._applied = reader.revision
        except ClosedError:
            return False
        except Exception as exc:  # noqa: BLE001 - ``where``'s, or the database's: kept
            with self._state:
                self._building, self._rebuild = False, True
            self._registry.install(self, read, None)  # the next change builds it again
            self._failed(exc)
            return False
        with self._state:
            self._building = False
            self._apply(self._registry.batch)
        self.recomputations += 1
        self.read_at = reader.revision
        self.error = None
        self._registry.install(self, read, reader.revision)
        return True
