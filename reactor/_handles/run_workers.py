"""``Workers``: the threads of ``state.serve`` that run workflows' runs (SPEC §14).

One taker thread per workflow served waits on that workflow's queue (woken by the
engine's hub, no polling) once a slot of ``concurrency`` is free, and hands the run it
took to a pool of ``concurrency`` threads. A keeper thread renews the leases of the
runs under way (a third of the lease at a time), so that a run outlives its lease only
when its process dies or stops answering; then another worker takes it again.

The workers join the engine's hub quietly: closing the engine (the state's last handle)
stops them as ``stop()`` does, so that no thread of theirs outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

from reactor._base.values import decode
from reactor._storage.txn import WriteTxn
from reactor._work import runs as _runs
from reactor.errors import (
    ClosedError,
    InvalidArgumentError,
    LockNotOwnedError,
    ReactorError,
)

from .async_run import call_workflow
from .queues import Queue, take_then
from .run import Run
from .run_waits import Waits
from .runner import Runner, Unwind

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .binding import Binding
    from .jobs import Job
    from .workflows import Registered

__all__ = ["Workers"]

logger = logging.getLogger("reactor")

LOOK: Final = 0.5  # seconds a taker waits for a slot, or for a run, before it looks again
QUEUE_ATTEMPTS: Final = 2**31 - 1  # the queue never kills a run's job: max_attempts does
STOP_TIMEOUT: Final = 30.0  # seconds stop() waits for the runs under way, by default


class Workers:
    """Worker threads serving workflows' runs until ``stop()``."""

    def __init__(self, binding: Binding, served: dict[str, Registered], concurrency: int) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise InvalidArgumentError(f"concurrency must be an int >= 1, not {concurrency!r}")
        self._binding = binding
        self._served = served
        self._stopping = threading.Event()
        self._concurrency = concurrency
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="reactor-run")
        self._lock = threading.Lock()
        self._running: dict[int, Runner] = {}
        self._waits = Waits(binding, list(served))  # wakes the runs in run.wait_for
        self._threads = [
            threading.Thread(
                target=self._take, args=(name,), name=f"reactor-runs[{name}]", daemon=True
            )
            for name in served
        ]
        self._threads.append(
            threading.Thread(target=self._keep, name="reactor-run-leases", daemon=True)
        )
        engine = self._engine = binding.engine
        try:
            engine.hub.add(self, quiet=True)  # told to finish as the engine closes
        except BaseException:
            self._waits.close()
            raise
        self._hub = engine.hub
        for thread in self._threads:
            thread.start()

    def __repr__(self) -> str:
        return f"<reactor.Workers of {sorted(self._served)}>"

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def workflows(self) -> list[str]:
        """The names of the workflows served."""
        return sorted(self._served)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop taking runs; the runs under way are given back at their next step (or
        end before it), each ready at once for another worker. Waits for them up to
        ``timeout`` seconds. Idempotent; closing the engine stops the workers too."""
        self._hub.remove(self)
        self._stopping.set()
        self._waits.close()
        self.join(timeout)

    # -- the hub's side (a quiet ``Listener``: told when the engine closes) -----------
    def start(self, published: int) -> None:
        """Not told: quiet."""

    def offer(self, record: object, event: object) -> None:
        """Not offered anything: quiet."""

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - a Listener's call
        """Stop taking runs; the runs under way unwind at their next step."""
        self._stopping.set()
        self._waits.stop_thread()

    def join(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the threads to end, the runs under way first."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self._waits.join_thread(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False)  # what was handed over still runs, and unwinds
        freed = 0
        while freed < self._concurrency and self._slots.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            freed += 1
        for _ in range(freed):
            self._slots.release()
        if freed == self._concurrency:
            self._pool.shutdown(wait=True)  # idle threads: they end at once
        else:
            logger.warning(
                "%d runs of %r were still under way after %.1f s; left running",
                self._concurrency - freed,
                self,
                timeout,
            )

    # -- threads ----------------------------------------------------------------------
    def _take(self, name: str) -> None:
        """Take ``name``'s runs, each claimed by its take, and hand each to the pool once
        a slot is free. A taker waits for its queue without a slot (each workflow's
        taker waits on its own, so that one with no runs never keeps a slot from the
        others); a run taken while every slot stays busy for half its lease goes back,
        ready, for another worker, and the taker takes nothing more until a slot is free
        (else it would take that run again at once, and keep it from the others)."""
        registered = self._served[name]
        queue = Queue(self._binding, _runs.queue_of(name), QUEUE_ATTEMPTS)
        claim = _Claim(self._engine, name, registered, self._stopping)
        while not self._stopping.is_set():
            try:
                job = take_then(queue, registered.lease, LOOK, claim)
                runner, doc = claim.taken()
            except ClosedError:  # the handle closed: the engine's close (or stop) joins us
                self._stopping.set()
                self._waits.close()
                break
            except Exception:  # the database, or a run's claim (its document unreadable)
                logger.exception("taking a run of workflow %r failed; trying again", name)
                self._stopping.wait(LOOK)
                continue
            if job is None or runner is None or doc is None:
                continue  # none, or nothing to run: ended by the claim (recorded)
            if not self._slots.acquire(timeout=registered.lease / 2):
                _give_back(runner)
                self._until_a_slot_is_free()  # not taking it again meanwhile: others may
                continue
            if self._stopping.is_set() or not self._submit(registered, runner, doc):
                _give_back(runner)
                self._slots.release()
                break
        self._pool.shutdown(wait=False)  # the idle threads end; what runs unwinds

    def _until_a_slot_is_free(self) -> None:
        while not self._stopping.is_set():
            if self._slots.acquire(timeout=LOOK):
                self._slots.release()
                return

    def _submit(self, registered: Registered, runner: Runner, doc: _runs.Document) -> bool:
        try:
            self._pool.submit(self._run, registered, runner, doc)
        except RuntimeError:  # the pool was shut down
            return False
        return True

    def _run(self, registered: Registered, runner: Runner, doc: _runs.Document) -> None:
        with self._lock:
            self._running[id(runner)] = runner
        try:
            _call(self._binding, runner, registered, doc)
        except ClosedError:
            pass
        except Exception:
            logger.exception(
                "run %s of workflow %r: recording it failed", runner.run_id, runner.workflow
            )
        finally:
            with self._lock:
                self._running.pop(id(runner), None)
            self._slots.release()

    def _keep(self) -> None:
        """Renew the leases of the runs under way, a third of the lease at a time."""
        every = min(registered.lease for registered in self._served.values()) / 3
        while not self._stopping.wait(every):
            with self._lock:
                runners = list(self._running.values())
            for runner in runners:
                try:
                    runner.job.extend()
                except LockNotOwnedError:
                    runner.lost = True
                except ClosedError:  # the handle closed: its takers stop the workers
                    return
                except ReactorError:
                    logger.exception("renewing the lease of run %s failed", runner.run_id)


def _call(binding: Binding, runner: Runner, registered: Registered, doc: _runs.Document) -> None:
    """Call the workflow function on the run, and record how it ended."""
    options = runner.engine.options
    run = Run(binding, runner, doc)
    try:
        value = decode(_runs.encode_value(options, doc["input"]))
        result = call_workflow(registered.fn, run, value)
        value = decode(_runs.encode_value(options, result))
    except Unwind:
        return
    except Exception as exc:  # noqa: BLE001 - recorded: the run failed
        _end(runner, "failed", error=_runs.error_of(exc))
        return
    _end(runner, "succeeded", result=value)


def _end(
    runner: Runner, status: str, result: object = None, error: dict[str, str] | None = None
) -> None:
    """Record the run's end, unless it is no longer this worker's."""
    with contextlib.suppress(Unwind):
        runner.finish(status, result, error)


def _give_back(runner: Runner) -> None:
    """A run claimed as the workers stop, or with no slot free: ready again at once, for
    another worker, without counting an attempt (left to its lease if that fails)."""
    with contextlib.suppress(ReactorError, Unwind):
        runner.release()


class _Claim:
    """What a taker's take does with the job it takes (``take_then``): claims its run,
    in the take's transaction."""

    def __init__(
        self, engine: EnginePort, name: str, registered: Registered, stopping: threading.Event
    ) -> None:
        self.scopes: tuple[str, ...] = _runs.shared_locks(name)
        self._engine = engine
        self._name = name
        self._max_attempts = registered.max_attempts
        self._stopping = stopping
        self._found: tuple[Runner | None, _runs.Document | None] = (None, None)

    def made(self, txn: WriteTxn, job: Job) -> None:
        runner = Runner(self._engine, job, self._name, self._max_attempts, self._stopping)
        if runner.child:  # its claim may write its parent's runs: not under these locks
            self._found = (runner, None)
            return
        doc = runner.apply(txn, runner.claim)
        self._found = (runner, None if runner.ended else doc)

    def taken(self) -> tuple[Runner | None, _runs.Document | None]:
        """The last take's runner and its run's document (None: nothing to run), once;
        a child run is claimed now, in a transaction of its own."""
        (runner, doc), self._found = self._found, (None, None)
        if runner is not None and runner.child:
            doc = runner.claim_alone()
        return runner, doc
