"""``Turn``: a lock that a KeyboardInterrupt cannot leave taken.

CPython runs signal handlers between bytecodes: at a function's start, at a loop's
backward jump, and right after a call into C returns, but not when a Python function
returns to its caller. So a Ctrl-C can land just after ``lock.acquire()`` took a lock,
before the ``try`` whose ``finally`` gives it back, however the two are written; a
plain lock lost that way is lost for good, and every later writer waits out its
timeout.

A turn is taken by ``take``, a Python function: the acquire runs inside its own
``try``, whose handler gives back a lock the interrupt found taken (an ``RLock``
records its owner in C as it is taken, so the handler can ask). ``take`` then returns
to its caller, and nothing can land between that return and the caller's next
instruction, its ``try``. ``give_back`` is the lock's own release, a call into C: in a
``finally`` it runs whole. A second interrupt inside that handler is the only way left
to lose a turn; the thread that lost it gets it back the next time it asks
(``reclaim``): turns never nest, so a turn a thread holds as it asks for one is one it
lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Turn"]


class Turn:
    """Take turns across threads; see the module's docstring."""

    __slots__ = ("_held", "_lock", "give_back")

    def __init__(self) -> None:
        self._lock = lock = threading.RLock()
        self.give_back: Callable[[], None] = lock.release  # C: runs whole
        # Whether this thread holds the lock, asked in C: a private of the stdlib's
        # RLock, which threading.Condition calls the same way (there is no public one).
        self._held: Callable[[], bool] = lock._is_owned  # type: ignore[attr-defined]  # noqa: SLF001

    def take(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds (-1: for ever) for the turn; whether this
        thread has it."""
        lock = self._lock
        if self._held():
            self.reclaim()
        try:
            return lock.acquire(True, timeout)
        except BaseException:
            if self._held():  # taken as the interrupt came
                lock.release()
            raise

    def try_take(self) -> bool:
        """Take the turn if nobody has it; whether this thread has it."""
        lock = self._lock
        if self._held():
            self.reclaim()
        try:
            return lock.acquire(False)
        except BaseException:
            if self._held():
                lock.release()
            raise

    def reclaim(self) -> None:
        """Give back a turn this thread holds: one an interrupt kept from its release."""
        held, release = self._held, self._lock.release
        while held():
            release()
