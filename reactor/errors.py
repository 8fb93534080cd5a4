"""The errors reactor raises: one tree, rooted at :class:`ReactorError`.

```text
ReactorError
├── ClosedError                    the handle (or its engine) is closed
├── SchemaError                    the database was written by a newer reactor
├── StorageError                   the database failed; the cause is chained
│   ├── BusyError (TimeoutError)   another process held the database too long
│   ├── OutcomeUnknownError        the connection broke while a commit was in flight
│   └── ReadOnlyError              a write to a database opened read-only, or not writable
├── OperationTimeout (TimeoutError) no answer from the scope's actor, or wait_for, in time
├── InvalidValueError (ValueError) a value that is not storable JSON
├── InvalidKeyError (ValueError)   a key or scope name that is not allowed
├── InvalidArgumentError (ValueError) a bad argument (ttl <= 0, NaN, ...)
├── InvalidOpError (ValueError)    update ops that are not a list of op dicts
├── TypeMismatchError (TypeError)  the stored value has the wrong type for the verb
├── ReentrancyError (RuntimeError) a call that would wait on itself
├── ConflictError                  another process changed a transaction's scope
├── LockNotOwnedError              releasing a lock this holder does not own
├── LockTimeout (TimeoutError)     a lock was not acquired in time
├── RevisionCompactedError (LookupError) the change log no longer holds a revision
└── WorkflowError                  a durable workflow's run went wrong (SPEC §14)
    ├── StepFailedError            a step raised past its retries (``error``)
    ├── NonDeterminismError        a resumed run called its steps differently
    ├── RunDeadError               a run's workers died ``max_attempts`` times
    ├── WorkflowFailedError        the run failed (``error``: its recorded error)
    └── RunCancelledError          the run was cancelled
```

Errors from SQLAlchemy, the database driver and pykka never reach a caller as such:
they are translated at the boundary, with the original chained as ``__cause__``.
Every error means the operation changed nothing, except ``OutcomeUnknownError`` (the
write may or may not have committed) and where its text says otherwise.
"""

from __future__ import annotations

__all__ = [
    "BusyError",
    "ClosedError",
    "ConflictError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidOpError",
    "InvalidValueError",
    "LockNotOwnedError",
    "LockTimeout",
    "NonDeterminismError",
    "OperationTimeout",
    "OutcomeUnknownError",
    "ReactorError",
    "ReadOnlyError",
    "ReentrancyError",
    "RevisionCompactedError",
    "RunCancelledError",
    "RunDeadError",
    "SchemaError",
    "StepFailedError",
    "StorageError",
    "TypeMismatchError",
    "WorkflowError",
    "WorkflowFailedError",
]


class ReactorError(Exception):
    """The root of every error reactor raises."""


class ClosedError(ReactorError):
    """The handle, or a scope taken from it, is used after ``close()``."""


class SchemaError(ReactorError):
    """The database was written by a newer version of reactor; it is left untouched."""


class StorageError(ReactorError):
    """The database failed the operation; nothing was applied. The cause is chained."""


class BusyError(StorageError, TimeoutError):
    """Another process kept the database locked beyond the timeout; nothing was applied."""


class OutcomeUnknownError(StorageError):
    """The connection to the database was lost while the commit was in flight: the
    write may have been applied or not. Read the state again (or the change log) to
    find out; events of the write, if it committed, are still delivered."""


class ReadOnlyError(StorageError):
    """A write to a database opened with ``readonly=True``, or to one this process may
    not write (its file or folder is not writable); nothing was applied. Also raised by
    ``open(..., readonly=True)`` when the database cannot be read without a write
    first: it does not exist, is empty, or needs a migration or a recovery."""


class OperationTimeout(ReactorError, TimeoutError):
    """The scope's actor did not answer within the timeout, or ``wait_for`` saw no value
    satisfy it within its ``timeout``.

    A write that had not started is withdrawn; one already running may still commit.
    """


class InvalidValueError(ReactorError, ValueError):
    """A value that would not come back equal from the database (see SPEC §2)."""


class InvalidKeyError(ReactorError, ValueError):
    """A key or scope name that is not a non-empty ``str`` of at most 1,024 characters."""


class InvalidArgumentError(ReactorError, ValueError):
    """An argument out of its range: a ``ttl`` that is not a number > 0, a NaN, ..."""


class InvalidOpError(ReactorError, ValueError):
    """``update`` ops that are not a list of dicts, or that mix the two op styles."""


class TypeMismatchError(ReactorError, TypeError):
    """The verb does not apply to the type of the stored value (or of an argument)."""


class ReentrancyError(ReactorError, RuntimeError):
    """A call that would wait on the caller itself, such as using a scope's own handle
    inside its transaction."""


class ConflictError(ReactorError):
    """Another process committed to a transaction's scope while its body ran; the
    transaction was not applied (run it again)."""


class LockNotOwnedError(ReactorError):
    """Releasing or extending a lock that expired or belongs to another holder."""


class LockTimeout(ReactorError, TimeoutError):
    """A lock was not acquired within its timeout."""


class RevisionCompactedError(ReactorError, LookupError):
    """The change log no longer holds the revision asked for (it was compacted)."""


class WorkflowError(ReactorError):
    """A durable workflow's run went wrong (SPEC §14). ``error`` is the recorded error,
    ``{"type": ..., "message": ...}``, where there is one."""

    def __init__(self, message: str, error: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.error: dict[str, str] = error or {"type": type(self).__name__, "message": message}


class StepFailedError(WorkflowError):
    """A step raised past its retries; ``error`` holds the original's type name and
    message. Raised in the workflow, which may catch it."""


class NonDeterminismError(WorkflowError):
    """A resumed run called its steps in another order, or with other names, than it
    had recorded: the run fails."""


class RunDeadError(WorkflowError):
    """A run whose workers' leases ran out ``max_attempts`` times: recorded, the run fails."""


class WorkflowFailedError(WorkflowError):
    """The run failed (``RunHandle.result``); ``error`` is what it recorded."""


class RunCancelledError(WorkflowError):
    """The run was cancelled (``state.cancel``)."""
