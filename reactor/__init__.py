"""reactor: an actor-based, persistent, reactive state engine.

```python
import reactor

with reactor.open("state.db") as state:
    orders = state.scope("orders")
    orders.set("o-1", {"total": 120})
    orders.increment("count")
```
"""

import importlib as _importlib
import logging as _logging
import threading as _threading
import types as _types
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from . import errors
from .errors import (
    BusyError,
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidOpError,
    InvalidValueError,
    LockNotOwnedError,
    LockTimeout,
    NonDeterminismError,
    OperationTimeout,
    OutcomeUnknownError,
    ReactorError,
    ReadOnlyError,
    ReentrancyError,
    RevisionCompactedError,
    RunCancelledError,
    RunDeadError,
    SchemaError,
    StepFailedError,
    StorageError,
    TypeMismatchError,
    WorkflowError,
    WorkflowFailedError,
)

if _TYPE_CHECKING:
    from . import aio, codecs, ops, signals
    from ._base.clock import Clock
    from ._base.codecs import Codec, TypedCodec
    from ._base.results import (
        Change,
        Derived,
        Entry,
        RunInfo,
        Snapshot,
        StepInfo,
        Timer,
        UpdateResult,
    )
    from ._base.values import MISSING, Missing
    from ._engine.events import ChangeEvent, EventType
    from ._engine.options import Durability
    from ._handles.derived import DerivedValue
    from ._handles.locks import Lock
    from ._handles.open import open  # noqa: A004 - reactor.open, as the spec names it
    from ._handles.queues import Job, JobInfo, Queue
    from ._handles.reader import Reader, ScopeReader
    from ._handles.run import Run
    from ._handles.run_handle import RunHandle
    from ._handles.run_workers import Workers
    from ._handles.scope import Scope
    from ._handles.state import State
    from ._handles.subscriptions import Subscription, Watch
    from ._handles.transaction import MultiTransaction, Transaction
    from ._handles.verbs import ScopeVerbs
    from ._version import __version__

# A library leaves logging to the application (docs/guides/logging.md): without a
# handler of its own, its warnings would reach stderr through logging's last resort in
# programs that configured no logging.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

# Loaded on first use: `import reactor` costs a few milliseconds, and a program that
# needs only a part of reactor (the command line's `reactor get`, a module importing
# reactor.errors) never pays for the rest. The first public name asked for loads them
# all at once, into this module's namespace, where typing.get_type_hints looks up the
# annotations of classes whose __module__ is reactor.
_HOMES = {
    "reactor._base.clock": ("Clock",),
    "reactor._base.codecs": ("Codec", "TypedCodec"),
    "reactor._base.results": (
        "Change",
        "Derived",
        "Entry",
        "RunInfo",
        "Snapshot",
        "StepInfo",
        "Timer",
        "UpdateResult",
    ),
    "reactor._base.values": ("MISSING", "Missing"),
    "reactor._engine.events": ("ChangeEvent", "EventType"),
    "reactor._engine.options": ("Durability",),
    "reactor._handles.derived": ("DerivedValue",),
    "reactor._handles.locks": ("Lock",),
    "reactor._handles.open": ("open",),
    "reactor._handles.queues": ("Job", "JobInfo", "Queue"),
    "reactor._handles.reader": ("Reader", "ScopeReader"),
    "reactor._handles.run": ("Run",),
    "reactor._handles.run_handle": ("RunHandle",),
    "reactor._handles.run_workers": ("Workers",),
    "reactor._handles.scope": ("Scope",),
    "reactor._handles.state": ("State",),
    "reactor._handles.subscriptions": ("Subscription", "Watch"),
    "reactor._handles.transaction": ("MultiTransaction", "Transaction"),
    "reactor._handles.verbs": ("ScopeVerbs",),
}
# Public submodules loaded with the names (reactor.aio is not: see _Submodule).
_SUBMODULES = ("codecs", "ops", "signals")
# Where users find them, for repr(), help() and pickle: reactor.Scope, not
# reactor._handles.scope.Scope (as httpx does). mypy and the API reference read the
# source and are not affected; error messages name classes by their short name anyway.
_HOMED = (
    "Change",
    "ChangeEvent",
    "Clock",
    "Derived",
    "DerivedValue",
    "Entry",
    "Job",
    "JobInfo",
    "Lock",
    "Missing",
    "MultiTransaction",
    "Queue",
    "Reader",
    "Run",
    "RunHandle",
    "RunInfo",
    "Scope",
    "ScopeReader",
    "ScopeVerbs",
    "Snapshot",
    "State",
    "StepInfo",
    "Subscription",
    "Timer",
    "Transaction",
    "UpdateResult",
    "Watch",
    "Workers",
    "open",
)
_loading = _threading.RLock()


def _load() -> None:
    """Import every public name into this module, and make reactor their home."""
    names = globals()
    for home, public in _HOMES.items():
        module = _importlib.import_module(home)
        for name in public:
            names[name] = getattr(module, name)
    for name in _SUBMODULES:
        names[name] = _importlib.import_module(f"{__name__}.{name}")
    for name in _HOMED:
        names[name].__module__ = __name__


class _Submodule(_types.ModuleType):
    """A public submodule, imported on the first use of one of its attributes
    (reactor.aio: asyncio and a thread pool). Once imported (``import reactor.aio`` does
    it too), the module itself takes its place in the package."""

    def __getattr__(self, name: str) -> _Any:
        return getattr(_importlib.import_module(self.__name__), name)

    def __dir__(self) -> list[str]:
        return dir(_importlib.import_module(self.__name__))


if not _TYPE_CHECKING:
    aio = _Submodule(f"{__name__}.aio")


def __getattr__(name: str) -> _Any:
    if name == "__version__":  # importlib.metadata: only when asked
        from ._version import __version__

        return __version__
    if name in _SUBMODULES and name not in globals():  # reactor.ops, before any name
        return _importlib.import_module(f"{__name__}.{name}")
    if name in __all__:
        with _loading:
            if name not in globals():
                _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "MISSING",
    "BusyError",
    "Change",
    "ChangeEvent",
    "Clock",
    "ClosedError",
    "Codec",
    "ConflictError",
    "Derived",
    "DerivedValue",
    "Durability",
    "Entry",
    "EventType",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidOpError",
    "InvalidValueError",
    "Job",
    "JobInfo",
    "Lock",
    "LockNotOwnedError",
    "LockTimeout",
    "Missing",
    "MultiTransaction",
    "NonDeterminismError",
    "OperationTimeout",
    "OutcomeUnknownError",
    "Queue",
    "ReactorError",
    "ReadOnlyError",
    "Reader",
    "ReentrancyError",
    "RevisionCompactedError",
    "Run",
    "RunCancelledError",
    "RunDeadError",
    "RunHandle",
    "RunInfo",
    "SchemaError",
    "Scope",
    "ScopeReader",
    "ScopeVerbs",
    "Snapshot",
    "State",
    "StepFailedError",
    "StepInfo",
    "StorageError",
    "Subscription",
    "Timer",
    "Transaction",
    "TypeMismatchError",
    "TypedCodec",
    "UpdateResult",
    "Watch",
    "Workers",
    "WorkflowError",
    "WorkflowFailedError",
    "__version__",
    "aio",
    "codecs",
    "errors",
    "open",
    "ops",
    "signals",
]
