"""``Binding``: what ties a handle to its engine.

A ``State`` is bound to its engine until it is closed; every handle taken from it
(scope, transaction, queue, lock) shares that binding, so closing the state closes
them all. The modules that are handed a ``State`` by a user (``reactor.aio``, the
import, the dashboard) find its binding with ``binding_of``: no module reads another's
private attributes to reach the engine.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from reactor._engine.options import Options, with_codec
from reactor.errors import ClosedError

if TYPE_CHECKING:
    from reactor._base.codecs import Codec
    from reactor._engine.engine import Engine
    from reactor._engine.port import EnginePort

__all__ = ["Binding", "bind", "binding_of", "engine_of"]


class Binding:
    """A handle's engine while the handle is open."""

    __slots__ = ("__weakref__", "_lock", "codec", "current")

    def __init__(self, engine: Engine, codec: Codec | None = None) -> None:
        # The engine until the handle lets go of it (closed or not: see ``engine``);
        # read as it is on the hottest paths, where a property's call would cost.
        self.current: Engine | None = engine
        self.codec = codec  # the handle's, for every handle taken from it
        self._lock = threading.Lock()

    def options(self, engine: EnginePort, codec: Codec | None = None) -> Options:
        """What the handle's writes check and encode with: the engine's options, with
        ``codec`` (else the handle's codec) if there is one."""
        chosen = self.codec if codec is None else codec
        return engine.options if chosen is None else with_codec(engine.options, chosen)

    @property
    def engine(self) -> EnginePort:
        """The engine.

        Raises:
            ClosedError: the handle, or its engine, is closed.
        """
        engine = self.current
        if engine is None or engine.closed:
            raise ClosedError("this reactor handle is closed")
        return engine

    def check(self) -> None:
        """Raises:
        ClosedError: the handle, or its engine, is closed.
        """
        if self.closed:
            raise ClosedError("this reactor handle is closed")

    @property
    def closed(self) -> bool:
        engine = self.current
        return engine is None or engine.closed

    @property
    def released(self) -> bool:
        """Whether the handle let go of its engine (``release``), closed or not."""
        return self.current is None

    def release(self) -> Engine | None:
        """Let go of the engine (once): it, or None if already let go."""
        with self._lock:
            engine, self.current = self.current, None
        return engine


_bindings: weakref.WeakKeyDictionary[object, Binding] = weakref.WeakKeyDictionary()


def bind(handle: object, engine: Engine, codec: Codec | None = None) -> Binding:
    """Bind ``handle`` (a ``State``) to ``engine``; its binding."""
    binding = _bindings[handle] = Binding(engine, codec)
    return binding


def binding_of(handle: object) -> Binding:
    """The binding of a ``State``.

    Raises:
        TypeError: ``handle`` is not one.
    """
    try:
        return _bindings[handle]
    except (KeyError, TypeError):
        raise TypeError(f"expected a reactor.State, not {type(handle).__name__}") from None


def engine_of(handle: object) -> EnginePort:
    """The engine of a ``State``.

    Raises:
        ClosedError: the handle, or its engine, is closed.
        TypeError: ``handle`` is not a ``State``.
    """
    return binding_of(handle).engine
