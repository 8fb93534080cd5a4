"""reactor: an actor-based, persistent, reactive state engine.

```python
import reactor

with reactor.open("state.db") as state:
    orders = state.scope("orders")
    orders.set("o-1", {"total": 120})
    orders.increment("count")
```
"""

from . import aio, errors, ops, signals
from ._clock import Clock
from ._events import ChangeEvent
from ._locks import Lock
from ._open import open  # noqa: A004 - reactor.open, as the spec names it
from ._results import Change, Snapshot, UpdateResult
from ._scope import Scope
from ._state import State
from ._subscriptions import Subscription, Watch
from ._transaction import Transaction
from ._values import MISSING, Missing
from ._version import __version__
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
    OperationTimeout,
    OutcomeUnknownError,
    ReactorError,
    ReentrancyError,
    RevisionCompactedError,
    SchemaError,
    StorageError,
    TypeMismatchError,
)

__all__ = [
    "MISSING",
    "BusyError",
    "Change",
    "ChangeEvent",
    "Clock",
    "ClosedError",
    "ConflictError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidOpError",
    "InvalidValueError",
    "Lock",
    "LockNotOwnedError",
    "LockTimeout",
    "Missing",
    "OperationTimeout",
    "OutcomeUnknownError",
    "ReactorError",
    "ReentrancyError",
    "RevisionCompactedError",
    "SchemaError",
    "Scope",
    "Snapshot",
    "State",
    "StorageError",
    "Subscription",
    "Transaction",
    "TypeMismatchError",
    "UpdateResult",
    "Watch",
    "__version__",
    "aio",
    "errors",
    "open",
    "ops",
    "signals",
]
