"""The blinker signals reactor sends.

``changed`` is sent once for every change committed to a database this process has
open (other processes' changes included, once this process sees them), after the
commit, in revision order, with the scope name as sender and ``event=ChangeEvent``:

```python
from reactor import signals

@signals.changed.connect_via("orders")        # only changes to scope "orders"
def on_order(sender: str, event: reactor.ChangeEvent) -> None: ...
```

Receivers run on the engine's dispatcher thread: keep them quick, or use
``state.subscribe``, which gives each subscriber its own thread and buffer. A receiver
that raises is logged and counted; the others still run. blinker holds receivers
weakly unless connected with ``weak=False``.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = ["changed"]

_namespace = Namespace()

changed = _namespace.signal(
    "changed",
    doc="A change committed to a scope: sender is the scope name, event= the ChangeEvent.",
)
