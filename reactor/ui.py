"""The dashboard as an ASGI app, to mount in your own Starlette or FastAPI app.

```python
import reactor
from reactor.ui import create_app
from starlette.applications import Starlette
from starlette.routing import Mount

state = reactor.open(":memory:")
app = Starlette(routes=[Mount("/reactor", app=create_app(state))])
```

The page and its API answer under the prefix (``/reactor/``, ``/reactor/api/...``):
the page asks for everything by relative URL. The app adds no login of its own: put it
behind yours (a middleware, or a dependency of the router it is mounted in). See
docs/guides/dashboard.md.

Starlette (the ``ui`` extra, with uvicorn and sse-starlette) is imported by
``import reactor.ui``, not by ``import reactor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from reactor._ui.app import build_app
from reactor._ui.feed import DEFAULT_PING
from reactor._ui.series import DEFAULT_INTERVAL
from reactor.aio.state import adopt
from reactor.errors import InvalidArgumentError

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from reactor import State

__all__ = ["create_app"]


def create_app(
    state: State,
    *,
    write: bool = False,
    hosts: Sequence[str] | None = None,
    ping: float = DEFAULT_PING,
    sample_every: float = DEFAULT_INTERVAL,
) -> Starlette:
    """The dashboard of the open ``state``, as a Starlette app (ASGI) to mount or serve.

    ``write``: allow the page to write (set, update, delete, cancel a timer or a job,
    retry and purge dead letters), as ``reactor ui --write``; reads only by default.
    ``hosts``: the names the ``Host`` header may carry (``["127.0.0.1", "localhost"]``
    when served on its own, against DNS rebinding); None, the default, checks none,
    leaving it to the app it is mounted in. ``ping``: seconds between the change feed's
    keep-alive comments. ``sample_every``: seconds between two samples of the charts'
    figures (the last hour of them is kept in memory).

    ``state`` stays yours: the app never closes it. Its lifespan (run by uvicorn for
    an app served alone; a mounted app's by yours, see the guide) starts the sampler of
    the charts' figures and, on shutdown, stops it and the app's worker threads.

    Raises:
        InvalidArgumentError: ``sample_every`` is not above 0.
        ClosedError: ``state`` is closed.
        TypeError: ``state`` is not a ``reactor.State``.
    """
    if not sample_every > 0:
        raise InvalidArgumentError(f"sample_every must be > 0 seconds, not {sample_every!r}")
    return build_app(
        adopt(state),
        owned=False,
        write=write,
        hosts=hosts,
        ping=ping,
        sample_every=sample_every,
    )
