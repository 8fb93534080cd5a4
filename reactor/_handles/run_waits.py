"""``Waits``: what wakes the runs suspended in ``run.wait_for`` (SPEC §14), in a
serving process.

It follows the runs of the workflows served (the changes of their ``run:WORKFLOW``
scopes, and a look at the suspended ones when it starts) and keeps, for each key a
run waits for, the runs waiting on it. A change of such a key, in any process, makes
those runs ready: each looks again, and suspends again if the value does not do yet.
A key that changed between the run's look and the moment the watcher learns of the
wait is caught by its revision, recorded with the wait.

It listens in the engine's hub, indexed by exact scope and key: the runs' scopes, and
each key waited for (a listener joins for it, before the key's revision is checked, and
leaves when no run waits on it). So the follower reads only those scopes' changes of
other processes, and the dispatcher's thread passes over a run's change with a look at
its text: only a document that may be suspended (or a run known to wait) is decoded,
on this watcher's own thread, where the wake-ups (commits) are made too. Every serving
process reading and decoding every change of every run was a fifth of a worker's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from reactor._base.values import decode
from reactor._work import runs as _runs
from reactor.errors import ClosedError, ReactorError

from .scope import Scope

if TYPE_CHECKING:
    from reactor._engine.events import ChangeEvent
    from reactor._storage.records import ChangeRecord

    from .binding import Binding

__all__ = ["Waits"]

logger = logging.getLogger("reactor")
Waiter = tuple[str, str, int]  # workflow, run id, the step's position
# Seconds before each new try of a wake-up that failed (about 4 s in all; meanwhile the
# next keys' wake-ups wait: the database is failing for them too).
WAKE_PAUSES: Final = (0.05, 0.2, 0.5, 1.0, 2.0)
STOP_TIMEOUT: Final = 10.0  # seconds close() waits for the watcher's thread
# A document that may be suspended holds this text (a JSON string needs no escape).
_SUSPENDED: Final = '"suspended"'


class Waits:
    """The keys the suspended runs of ``workflows`` wait for, and their wake-ups."""

    def __init__(self, binding: Binding, workflows: list[str]) -> None:
        self._binding = binding
        self._workflows = set(workflows)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._waiting: dict[tuple[str, str], set[Waiter]] = {}  # (scope, key) -> runs
        self._of_run: dict[tuple[str, str], tuple[str, str]] = {}  # run -> its key
        self._keys: dict[tuple[str, str], _KeyListener] = {}  # the hub's, of each key
        # The runs whose document was last seen suspended (the dispatcher's thread
        # keeps it): a later change of one may end its wait.
        self._suspended: set[tuple[str, str]] = set()
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="reactor-run-waits", daemon=True)
        self._thread.start()
        engine = binding.engine
        self._hub = engine.hub  # to leave it after the handle closed too
        self._runs = [_RunListener(self, workflow) for workflow in sorted(self._workflows)]
        try:
            for listener in self._runs:
                engine.hub.add(listener, _runs.scope_of(listener.workflow))
            for workflow in sorted(self._workflows):
                for doc in Scope(binding, _runs.scope_of(workflow)).list().values():
                    if isinstance(doc, dict) and doc.get("status") == "suspended":
                        self._suspended.add((workflow, str(doc.get("id"))))
                        self._follow(workflow, doc)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._closing.set()  # a wake-up waiting to be tried again gives up
        with self._lock:
            listeners: list[_RunListener | _KeyListener] = [*self._runs, *self._keys.values()]
            self._keys.clear()
        for listener in listeners:
            self._hub.remove(listener)
        self.stop_thread()
        self.join_thread(STOP_TIMEOUT)

    def stop_thread(self) -> None:
        """Tell the watcher's thread to stop (the tasks queued before are dropped)."""
        self._closing.set()
        self._tasks.put(None)

    def join_thread(self, timeout: float) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the watcher's thread ---------------------------------------------------------
    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the watcher's thread, after those submitted before it."""
        self._tasks.put(task)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None or self._closing.is_set():
                return
            try:
                task()
            except ClosedError:
                return
            except Exception:  # one run's trouble must not stop the others' wake-ups
                logger.exception("following the runs waiting in run.wait_for failed")

    # -- the runs (offered on the dispatcher's thread) ---------------------------------
    def offer_run(self, workflow: str, record: ChangeRecord) -> None:
        """A change of a run's document: looked at on the watcher's thread if it may
        be suspended now, or was suspended before; passed over otherwise."""
        run = (workflow, record.key)
        text = record.new_value
        if text is not None and _SUSPENDED in text:
            self._suspended.add(run)
            self.submit(lambda: self._follow(workflow, decode(text)))
        elif run in self._suspended:
            self._suspended.discard(run)
            self.submit(lambda: self._forget(run))

    def _follow(self, workflow: str, doc: Any) -> None:
        if not isinstance(doc, dict):
            return
        run = (workflow, str(doc.get("id")))
        waiting = _runs.waiting_on_key(doc)
        if waiting is None:
            self._forget(run)
            return
        scope, key, seen, position = waiting
        with self._lock:
            left = self._forget_locked(run)
            self._waiting.setdefault((scope, key), set()).add((*run, position))
            self._of_run[run] = (scope, key)
            joining = (scope, key) not in self._keys
            if joining:
                self._keys[(scope, key)] = _KeyListener(self, scope, key)
            listener = self._keys[(scope, key)]
        self._leave(left)
        if joining:
            # Listening before the look: a change after the look is offered.
            self._binding.engine.hub.add(listener, scope, key)
        entry = Scope(self._binding, scope).entry(key)
        if (0 if entry is None else entry.revision) != seen:  # changed meanwhile
            self._wake([(*run, position)])

    def _forget(self, run: tuple[str, str]) -> None:
        with self._lock:
            left = self._forget_locked(run)
        self._leave(left)

    def _forget_locked(self, run: tuple[str, str]) -> _KeyListener | None:
        """Forget ``run``'s wait; the key's listener if no run waits on it now."""
        watched = self._of_run.pop(run, None)
        if watched is None:
            return None
        runs = self._waiting.get(watched, set())
        for waiter in [w for w in runs if w[:2] == run]:
            runs.discard(waiter)
        if runs:
            return None
        self._waiting.pop(watched, None)
        return self._keys.pop(watched, None)

    def _leave(self, listener: _KeyListener | None) -> None:
        if listener is not None:
            self._hub.remove(listener)

    # -- the keys ---------------------------------------------------------------------
    def on_key(self, scope: str, key: str) -> None:
        with self._lock:
            waiters = list(self._waiting.get((scope, key), ()))
        self._wake(waiters)

    def _wake(self, waiters: list[Waiter]) -> None:
        for waiter in waiters:
            if not self._wake_one(*waiter):
                return

    def _wake_one(self, workflow: str, run_id: str, position: int) -> bool:
        """Make one run ready, tried again after each of ``WAKE_PAUSES`` while the
        database fails (busy, refusing, away a moment): a lost wake-up would leave the
        run waiting for the key's next change, or its timeout. False once closing."""
        engine = self._binding.engine
        work = _runs.wake(engine.options, workflow, run_id, position)
        for pause in (*WAKE_PAUSES, None):
            try:
                engine.commit(work, scopes=_runs.locks(workflow))
            except ClosedError:
                return False
            except ReactorError as exc:
                if pause is None:
                    logger.exception("waking run %s of workflow %r failed", run_id, workflow)
                    return True
                logger.warning(
                    "waking run %s of workflow %r failed (%s); trying again in %s s",
                    run_id,
                    workflow,
                    exc,
                    pause,
                )
                if self._closing.wait(pause):
                    return False
            else:
                return True
        return True  # pragma: no cover - the last pause is None


class _Listening:
    """A listener of the engine's hub (``reactor._engine.hub.Listener``) for ``Waits``:
    what it is offered goes to the watcher's thread; the engine closing stops it."""

    def __init__(self, waits: Waits) -> None:
        self.waits = waits

    def start(self, published: int) -> None:
        """Nothing to skip: what it is offered only makes it look at the database."""

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - a Listener's call
        self.waits.stop_thread()

    def join(self, timeout: float) -> None:
        self.waits.join_thread(timeout)


class _RunListener(_Listening):
    """Offered the changes of one served workflow's runs."""

    def __init__(self, waits: Waits, workflow: str) -> None:
        super().__init__(waits)
        self.workflow = workflow

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:  # noqa: ARG002 - a Listener's call
        self.waits.offer_run(self.workflow, record)


class _KeyListener(_Listening):
    """Offered the changes of one key that runs wait for."""

    def __init__(self, waits: Waits, scope: str, key: str) -> None:
        super().__init__(waits)
        self.scope = scope
        self.key = key

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:  # noqa: ARG002 - a Listener's call
        self.waits.submit(lambda: self.waits.on_key(self.scope, self.key))
