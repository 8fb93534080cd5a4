"""reactor: an actor-based, persistent, reactive state engine.

```python
import reactor

with reactor.open("state.db") as state:
    orders = state.scope("orders")
    orders.set("o-1", {"total": 120})
    orders.increment("count")
```
"""

from ._clock import Clock
from ._open import open  # noqa: A004 - reactor.open, as the spec names it
from ._results import Change
from ._scope import Scope
from ._state import State
from ._values import MISSING, Missing
from ._version import __version__
from .errors import (
    BusyError,
    ClosedError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidOpError,
    InvalidValueError,
    LockNotOwnedError,
    LockTimeout,
    OperationTimeout,
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
    "Clock",
    "ClosedError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidOpError",
    "InvalidValueError",
    "LockNotOwnedError",
    "LockTimeout",
    "Missing",
    "OperationTimeout",
    "ReactorError",
    "ReentrancyError",
    "RevisionCompactedError",
    "SchemaError",
    "Scope",
    "State",
    "StorageError",
    "TypeMismatchError",
    "__version__",
    "open",
]
