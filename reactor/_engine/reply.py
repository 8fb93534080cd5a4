"""The reply a thread waits on for its request to a scope actor (``ThreadReply``).

It does what the actor, a timeout and a callback ask of a
``concurrent.futures.Future`` (run unless withdrawn, withdraw unless running, settle
once, wait within a timeout), and what ``Future`` cannot: survive a Ctrl-C. Each step
of a ``Future`` enters a ``threading.Condition``, whose ``__enter__`` is a Python
function; a KeyboardInterrupt landing as it returns (the lock just taken, the ``with``
that gives it back not yet set up) leaves the lock with the interrupted caller for
good, and the actor settling that future then waits for ever: every later write to the
actor's scopes times out. Here each lock is a C lock entered by ``with`` directly
(nothing runs between the take and the ``with``), or the waiter's own ``acquire``,
whose loss harms nobody. It is cheaper too: two C calls to make one, where a
``Future`` makes a ``Condition`` in Python.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final, Generic, TypeVar

__all__ = ["ThreadReply"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

_PENDING: Final = 0
_RUNNING: Final = 1
_CANCELLED: Final = 2
_DONE: Final = 3


class ThreadReply(Generic[T]):
    """One request's outcome, settled once by the actor, waited for by a thread."""

    __slots__ = ("_callbacks", "_error", "_lock", "_settled", "_state", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _state, _value, _error, _callbacks
        self._settled = settled = threading.Lock()
        settled.acquire()  # held until the outcome is in: a waiter's acquire returns then
        self._state = _PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[ThreadReply[T]], object]] | None = None

    # -- the actor's side (``mailbox.Reply``) ----------------------------------------
    def set_running_or_notify_cancel(self) -> bool:
        """Mark it running unless it was withdrawn; whether it runs."""
        with self._lock:
            if self._state == _CANCELLED:
                return False
            self._state = _RUNNING
            return True

    def set_result(self, result: T) -> None:
        self._settle(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle(None, exception)

    # -- the waiter's side ---------------------------------------------------------
    def cancel(self) -> bool:
        """Withdraw it unless it is running or settled; whether it is withdrawn."""
        with self._lock:
            if self._state == _CANCELLED:
                return True
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
            callbacks, self._callbacks = self._callbacks, None
        self._settled.release()
        self._call(callbacks)
        return True

    def done(self) -> bool:
        return self._state >= _CANCELLED

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self, timeout: float | None = None) -> T:
        """The result, waiting up to ``timeout`` seconds (None: for ever).

        Raises:
            concurrent.futures.TimeoutError: not settled in time.
            concurrent.futures.CancelledError: it was withdrawn.
            BaseException: the request's own error.
        """
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self._value  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The request's error (None if it succeeded), waiting as ``result`` does."""
        if self._state < _CANCELLED:
            settled = self._settled
            if not settled.acquire(True, -1 if timeout is None else timeout):
                raise FutureTimeout
            settled.release()  # for the next waiter; lost to a Ctrl-C, _state answers it
        if self._state == _CANCELLED:
            raise CancelledError
        return self._error

    def add_done_callback(self, callback: Callable[[ThreadReply[T]], object]) -> None:
        """Call ``callback(self)`` once settled or withdrawn: at once if it is."""
        with self._lock:
            if self._state < _CANCELLED:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        self._call([callback])

    # -- settling ------------------------------------------------------------------
    def _settle(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._state >= _CANCELLED:
                raise InvalidStateError("the reply is settled already")
            self._value, self._error, self._state = value, error, _DONE
            callbacks, self._callbacks = self._callbacks, None
        self._settled.release()
        self._call(callbacks)

    def _call(self, callbacks: list[Callable[[ThreadReply[T]], object]] | None) -> None:
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:  # as Future does: one callback's bug stops no other
                logger.exception("a callback of %r failed", self)
