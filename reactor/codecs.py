"""Typed values: codecs that store dataclasses, ``datetime``, ``Decimal``, ``UUID``,
``bytes`` and pydantic models as plain JSON, and read them back by type.

``reactor.open(path, codec=TypedCodec())`` (or ``state.scope(name, codec=...)``) runs
every value a handle writes through the codec before it is checked and stored;
``scope.get(key, type=Order)`` decodes one back. What is stored is ordinary JSON, which
the CLI, the dashboard, export and other processes read as any other value.
"""

from __future__ import annotations

from reactor._base.codecs import Codec, TypedCodec

__all__ = ["Codec", "TypedCodec"]

for _public in (Codec, TypedCodec):
    _public.__module__ = __name__  # where users find them (repr, help, pickle)
del _public
