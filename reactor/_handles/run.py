"""``Run``: what a workflow function is given (SPEC §14), and ``Runner``, which runs
one taken run in a worker thread and writes its records.

Each call of the function replays the run from the top: a recorded step returns its
recorded result (or raises its recorded error) at once, in the recorded order (else
``NonDeterminismError``); the first step not recorded runs and is recorded before it
returns. Every record is a transaction over the run's scopes that first checks that
this worker still holds the run's job (its lease: fencing) and that nobody asked to
cancel it; a record that cannot be made ends the call (``Unwind``), leaving the run to
whoever holds it now.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.keys import check_key
from reactor._base.values import decode
from reactor._storage.txn import WriteTxn
from reactor._work import runs as _runs
from reactor.errors import (
    InvalidArgumentError,
    LockNotOwnedError,
    NonDeterminismError,
    OperationTimeout,
    RunDeadError,
    StepFailedError,
)

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .jobs import Job

__all__ = ["Run", "Runner", "Unwind"]

logger = logging.getLogger("reactor")
T = TypeVar("T")


class Unwind(BaseException):
    """Ends a call of the workflow function: the run was recorded as suspended or
    finished, released, or is no longer this worker's. A ``BaseException``, so that the
    function's ``except Exception`` does not stop it."""


class Runner:
    """One taken run, in one worker thread: its records."""

    def __init__(
        self,
        engine: EnginePort,
        job: Job,
        workflow: str,
        max_attempts: int,
        stopping: threading.Event,
    ) -> None:
        self.engine = engine
        self.job = job
        self.workflow = workflow
        self.run_id = str(job.item)
        self.max_attempts = max_attempts
        self.stopping = stopping
        self.lost = False  # the lease ran out (the keeper found it so)
        self.acked = False  # the record under way acknowledged the job

    # -- transactions ---------------------------------------------------------------
    def commit(self, change: Callable[[_runs.Store, _runs.Document], T]) -> T:
        """``change(store, doc)`` in a transaction that holds the run: this worker's
        lease checked, a cancellation honoured first.

        Raises:
            Unwind: the lease ran out (nothing written), or the run was cancelled
                (recorded now).
        """
        options = self.engine.options
        cancelled = False

        def work(txn: WriteTxn) -> Any:
            nonlocal cancelled
            self.acked = False
            store = _runs.Store(options, txn)
            doc = store.read(self.workflow, self.run_id)
            if doc is None or doc["status"] in _runs.FINAL:  # cancelled, or an orphan job
                self.job_done(store)
                cancelled = True
                return None
            self.job.hold(txn)
            done = change(store, doc)
            doc = store.read(self.workflow, self.run_id)
            if doc is not None and doc["cancel"] and doc["status"] not in _runs.FINAL:
                if not self.acked:
                    self.job_done(store)
                _finish(store, doc, "cancelled")
                cancelled = True
            return done

        try:
            done = self.engine.commit(work, scopes=_runs.locks(self.workflow))
        except LockNotOwnedError:
            self.lost = True
            logger.warning(
                "run %s of workflow %r: this worker's lease ran out; it stops, and the "
                "run goes on with its next holder",
                self.run_id,
                self.workflow,
            )
            raise Unwind from None
        if cancelled:
            raise Unwind
        return done  # type: ignore[no-any-return]

    def claim(self) -> _runs.Document | None:
        """Mark the run running, held by this worker; its document, or None when there
        is nothing to run (finished, cancelled, or dead now: recorded)."""

        def change(store: _runs.Store, doc: _runs.Document) -> _runs.Document | None:
            if doc["held"]:  # its last holder's lease ran out
                doc["attempts"] += 1
            doc["attempts"] = max(1, doc["attempts"])
            if doc["attempts"] > self.max_attempts:
                error = RunDeadError(
                    f"run {self.run_id} was taken {self.max_attempts} times, and each time "
                    "its worker's lease ran out"
                )
                self.job_done(store)
                _finish(store, doc, "failed", error=_runs.error_of(error))
                return None
            doc["held"] = True
            doc["status"] = "running"
            store.save(doc)
            return doc

        try:
            return self.commit(change)
        except Unwind:
            return None

    def job_done(self, store: _runs.Store) -> None:
        """Acknowledge the run's job in the record's transaction."""
        self.job.hold(store.txn, ack=True)
        self.acked = True

    def record_step(self, position: int, step: dict[str, Any]) -> None:
        """Record ``step`` at ``position`` (over a waiting one there)."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            _put_step(doc, position, step)
            store.save(doc)

        self.commit(change)

    def finish(self, status: str, result: Any = None, error: dict[str, str] | None = None) -> None:
        """Record the run's end, and acknowledge its job."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            self.job_done(store)
            _finish(store, doc, status, result, error)

        self.commit(change)

    def suspend(self, position: int, step: dict[str, Any], delay: float | None) -> None:
        """Record ``step`` as waiting, the run as suspended: its job acknowledged, and
        one put that makes it ready in ``delay`` seconds (None: none; what it waits for
        makes it ready)."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            _put_step(doc, position, step)
            doc["status"] = "suspended"
            doc["held"] = False
            self.job_done(store)
            store.save(doc)
            if delay is not None:
                store.ready(doc, max(delay, 0.0) or None)

        self.commit(change)
        raise Unwind

    def release(self) -> None:
        """Give the run back (this process stops serving): ready again at once, for
        any worker, without counting an attempt."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            doc["status"] = "pending"
            doc["held"] = False
            self.job_done(store)
            store.save(doc)
            store.ready(doc, None)

        self.commit(change)
        raise Unwind

    def receive(
        self, position: int, step: dict[str, Any], topic: str, deadline: float | None
    ) -> tuple[bool, Any]:
        """The next message of ``topic``, recorded at ``position``: (True, it); or
        (False, None) past ``deadline`` (recorded as a timeout); else the run is
        suspended (``Unwind``)."""

        def change(store: _runs.Store, doc: _runs.Document) -> tuple[bool, Any] | None:
            now = store.txn.now
            waiting = doc["inbox"].get(topic) or []
            if waiting:
                message = waiting.pop(0)
                if not waiting:
                    del doc["inbox"][topic]
                _put_step(
                    doc, position, {**step, "status": "succeeded", "result": message, "ended": now}
                )
                store.save(doc)
                return True, message
            if deadline is not None and now >= deadline:
                timeout = OperationTimeout(f"no message {topic!r} came in time")
                ended = {**step, "status": "failed", "error": _runs.error_of(timeout), "ended": now}
                _put_step(doc, position, ended)
                store.save(doc)
                return False, None
            return None

        outcome = self.commit(change)
        if outcome is not None:
            return outcome
        delay = None if deadline is None else deadline - self.engine.now()
        self.suspend(position, {**step, "status": "waiting"}, delay)
        raise AssertionError("suspend() raises")  # pragma: no cover


class Run:
    """The running workflow's side of a run: its id, input and attempts, and the verbs
    that record steps and suspend it."""

    def __init__(self, runner: Runner, doc: _runs.Document) -> None:
        self._runner = runner
        self._recorded: list[dict[str, Any]] = doc["steps"]
        self._position = 0
        self.id: str = doc["id"]
        """The run's id."""
        self.workflow: str = doc["workflow"]
        """The workflow's name."""
        self.input: Any = doc["input"]
        """What the run was started with."""
        self.attempts: int = doc["attempts"]
        """1 at its first take; one more each time it was taken after a lease ran out."""

    def __repr__(self) -> str:
        return f"<reactor.Run {self.id!r} of {self.workflow!r}>"

    # -- replay ---------------------------------------------------------------------
    def _next(self, name: str) -> tuple[int, dict[str, Any] | None]:
        """The position of the step called now, and its record if it has one.

        Raises:
            Unwind: it was recorded under another name (the run failed:
                ``NonDeterminismError``).
        """
        position = self._position
        self._position += 1
        if position >= len(self._recorded):
            return position, None
        recorded = self._recorded[position]
        if recorded["name"] != name:
            error = NonDeterminismError(
                f"step {position} of run {self.id} is {name!r} now, but {recorded['name']!r} "
                "was recorded: steps must be called in the recorded order"
            )
            self._runner.finish("failed", error=_runs.error_of(error))
            raise Unwind
        return position, recorded

    def _going_on(self) -> None:
        """Before a step runs: give the run back if this process stops serving."""
        if self._runner.stopping.is_set():
            self._runner.release()

    # -- steps ------------------------------------------------------------------------
    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int = 0,
        backoff: float = 1.0,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` and record its result before returning it; a
        recorded step returns its recorded result at once. An exception is retried up
        to ``retries`` times (waiting ``backoff`` seconds, doubled each time), then
        recorded and raised as ``StepFailedError``.

        Raises:
            StepFailedError: ``fn`` raised past its retries (now or when recorded).
            InvalidValueError: ``fn`` returned something that is not a value.
            InvalidKeyError: an empty ``name``.
            InvalidArgumentError: a bad ``retries`` or ``backoff``.
        """
        check_key(name, "step name")
        if type(retries) is not int or retries < 0:
            raise InvalidArgumentError(f"retries must be an int >= 0, not {retries!r}")
        pause = _runs.check_seconds(backoff, "backoff")
        position, recorded = self._next(name)
        if recorded is not None:
            return _replayed(recorded)
        self._going_on()
        runner = self._runner
        started = runner.engine.now()
        for attempt in range(retries + 1):
            try:
                result = fn(*args, **kwargs)
                break
            except Exception as exc:
                if attempt == retries:
                    error = _runs.error_of(exc)
                    ended = runner.engine.now()
                    step = _step(name, "failed", None, error, started, ended)
                    runner.record_step(position, step)
                    raise _step_failed(name, error) from exc
                if runner.stopping.wait(pause * 2**attempt):
                    runner.release()
        text = _runs.encode_value(runner.engine.options, result)
        value = decode(text)
        runner.record_step(
            position, _step(name, "succeeded", value, None, started, runner.engine.now())
        )
        return decode(text)

    def sleep(self, seconds: float) -> None:
        """Suspend the run for ``seconds``, holding no worker and no thread.

        Raises:
            InvalidArgumentError: not a finite number >= 0.
        """
        seconds = _runs.check_seconds(seconds, "seconds")
        self._sleep(lambda now: now + seconds)

    def sleep_until(self, epoch: float) -> None:
        """Suspend the run until ``epoch`` (seconds since the epoch).

        Raises:
            InvalidArgumentError: not a finite number >= 0.
        """
        until = _runs.check_seconds(epoch, "epoch")
        self._sleep(lambda _now: until)

    def _sleep(self, wake_at: Callable[[float], float]) -> None:
        position, recorded = self._next("sleep")
        if recorded is not None and recorded["status"] != "waiting":
            return
        runner = self._runner
        now = runner.engine.now()
        if recorded is None:
            self._going_on()
            step = _step("sleep", "waiting", None, None, now, None)
            step["until"] = wake_at(now)
        else:
            step = recorded
        if now >= step["until"]:
            runner.record_step(position, {**step, "status": "succeeded", "ended": now})
            return
        runner.suspend(position, step, step["until"] - now)

    def receive(self, topic: str, timeout: float | None = None) -> Any:
        """The next message ``state.send`` sent this run on ``topic`` (each received
        once, in order); the run is suspended until one comes.

        Raises:
            OperationTimeout: none came within ``timeout`` seconds (recorded).
            InvalidKeyError: an empty ``topic``.
            InvalidArgumentError: a bad ``timeout``.
        """
        check_key(topic, "topic")
        seconds = None if timeout is None else _runs.check_seconds(timeout, "timeout")
        name = f"receive:{topic}"
        position, recorded = self._next(name)
        if recorded is not None and recorded["status"] != "waiting":
            if recorded["status"] == "failed":
                raise OperationTimeout(recorded["error"]["message"])
            return recorded["result"]
        runner = self._runner
        if recorded is None:
            self._going_on()
            now = runner.engine.now()
            step = _step(name, "waiting", None, None, now, None)
            step["deadline"] = None if seconds is None else now + seconds
        else:
            step = recorded
        received, message = runner.receive(position, step, topic, step["deadline"])
        if not received:
            raise OperationTimeout(f"no message {topic!r} came within {timeout} s")
        return message


def _step(
    name: str,
    status: str,
    result: Any,
    error: dict[str, str] | None,
    started: float,
    ended: float | None,
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "result": result,
        "error": error,
        "started": started,
        "ended": ended,
    }


def _put_step(doc: _runs.Document, position: int, step: dict[str, Any]) -> None:
    steps = doc["steps"]
    if position < len(steps):
        steps[position] = step
    else:
        steps.append(step)


def _finish(
    store: _runs.Store,
    doc: _runs.Document,
    status: str,
    result: Any = None,
    error: dict[str, str] | None = None,
) -> None:
    doc["status"] = status
    doc["result"] = result
    doc["error"] = error
    doc["held"] = False
    store.save(doc)


def _replayed(recorded: dict[str, Any]) -> Any:
    if recorded["status"] == "failed":
        raise _step_failed(recorded["name"], recorded["error"])
    return recorded["result"]


def _step_failed(name: str, error: dict[str, str]) -> StepFailedError:
    return StepFailedError(f"step {name!r} failed: {error['type']}: {error['message']}", error)
