"""``Waits``: what wakes the runs suspended in ``run.wait_for`` (SPEC §14), in a
serving process.

It follows the runs of the workflows served (the events of their ``run:WORKFLOW``
scopes, and a look at the suspended ones when it starts) and keeps, for each key a
run waits for, the runs waiting on it. A change of such a key, in any process, makes
those runs ready: each looks again, and suspends again if the value does not do yet.
A key that changed between the run's look and the moment the watcher learns of the
wait is caught by its revision, recorded with the wait.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Final

from reactor._work import runs as _runs
from reactor.errors import ClosedError, ReactorError

from .scope import Scope
from .subscriptions import DEFAULT_BUFFER, Filter, Subscription

if TYPE_CHECKING:
    from reactor._engine.events import ChangeEvent

    from .binding import Binding

__all__ = ["Waits"]

logger = logging.getLogger("reactor")
Waiter = tuple[str, str, int]  # workflow, run id, the step's position
# Seconds before each new try of a wake-up that failed (about 4 s in all; meanwhile the
# next keys' wake-ups wait: the database is failing for them too).
WAKE_PAUSES: Final = (0.05, 0.2, 0.5, 1.0, 2.0)


class Waits:
    """The keys the suspended runs of ``workflows`` wait for, and their wake-ups."""

    def __init__(self, binding: Binding, workflows: list[str]) -> None:
        self._binding = binding
        self._workflows = set(workflows)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._waiting: dict[tuple[str, str], set[Waiter]] = {}  # (scope, key) -> runs
        self._of_run: dict[tuple[str, str], tuple[str, str]] = {}  # run -> its key
        engine = binding.engine
        self._subscriptions = [
            _subscribe(engine, self._on_run, "run:*", None),
            _subscribe(engine, self._on_key, None, self._watched),
        ]
        for workflow in workflows:
            for doc in Scope(binding, _runs.scope_of(workflow)).list().values():
                self._follow(workflow, doc)

    def close(self) -> None:
        self._closing.set()  # a wake-up waiting to be tried again gives up
        for subscription in self._subscriptions:
            subscription.close()

    # -- the runs ---------------------------------------------------------------------
    def _on_run(self, event: ChangeEvent) -> None:
        workflow = event.scope.removeprefix(_runs.INDEX)
        if workflow in self._workflows and isinstance(event.new_value, dict):
            self._follow(workflow, event.new_value)
        elif workflow in self._workflows and event.new_value is None:
            self._forget((workflow, event.key))

    def _follow(self, workflow: str, doc: dict[str, Any]) -> None:
        run = (workflow, str(doc.get("id")))
        waiting = _runs.waiting_on_key(doc)
        if waiting is None:
            self._forget(run)
            return
        scope, key, seen, position = waiting
        with self._lock:
            self._forget_locked(run)
            self._waiting.setdefault((scope, key), set()).add((*run, position))
            self._of_run[run] = (scope, key)
        entry = Scope(self._binding, scope).entry(key)
        if (0 if entry is None else entry.revision) != seen:  # changed meanwhile
            self._wake([(*run, position)])

    def _forget(self, run: tuple[str, str]) -> None:
        with self._lock:
            self._forget_locked(run)

    def _forget_locked(self, run: tuple[str, str]) -> None:
        watched = self._of_run.pop(run, None)
        if watched is None:
            return
        runs = self._waiting.get(watched, set())
        for waiter in [w for w in runs if w[:2] == run]:
            runs.discard(waiter)
        if not runs:
            self._waiting.pop(watched, None)

    # -- the keys ---------------------------------------------------------------------
    def _watched(self, event: ChangeEvent) -> bool:
        return (event.scope, event.key) in self._waiting

    def _on_key(self, event: ChangeEvent) -> None:
        with self._lock:
            waiters = list(self._waiting.get((event.scope, event.key), ()))
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


def _subscribe(engine: Any, callback: Any, scope: str | None, where: Any) -> Subscription:
    subscription = Subscription(
        engine,
        callback,
        Filter(scope, None, None, where),
        since=None,
        durable=None,
        max_retries=0,
        buffer_size=DEFAULT_BUFFER,
    )
    try:
        subscription.listen(None)
    except BaseException:
        subscription.close()
        raise
    subscription.deliver()
    return subscription
