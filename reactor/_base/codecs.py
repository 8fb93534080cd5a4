"""Codecs: typed Python values in, plain JSON stored.

A codec turns what a caller writes (a dataclass, a ``datetime``, a ``Decimal``...) into
plain JSON types before the value is checked and encoded, and turns a stored plain value
back into a type on request (``get(key, type=Order)``). What is stored stays ordinary
JSON, so the CLI, the dashboard, export and PostgreSQL read it as any other value.

``TypedCodec`` does the work with msgspec (its ``to_builtins`` and ``convert``, written
in C), imported on first use: opening a database without a codec costs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from reactor.errors import InvalidArgumentError, InvalidValueError, TypeMismatchError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["Codec", "TypedCodec", "check_codec", "default_codec"]

T = TypeVar("T")


@runtime_checkable
class Codec(Protocol):
    """What ``reactor.open(codec=...)`` and ``state.scope(name, codec=...)`` take: two
    methods, and any object that has them will do."""

    def encode(self, value: Any) -> Any:
        """``value`` as plain JSON types (``dict`` with ``str`` keys, ``list``, ``str``,
        ``int``, ``float``, ``bool``, ``None``), which reactor then checks and stores.

        Raises:
            InvalidValueError: ``value`` holds something the codec cannot encode.
        """
        ...

    def decode(self, value: Any, type: Any) -> Any:  # noqa: A002 - as get(type=) names it
        """``value`` (plain JSON, as stored) as an instance of ``type``.

        Raises:
            TypeMismatchError: ``value`` does not fit ``type``.
        """
        ...


class TypedCodec:
    """Encodes ``datetime``, ``date`` and ``time`` (ISO 8601 text), ``timedelta`` (ISO
    8601 duration), ``Decimal`` (text: exact), ``UUID`` (text), ``bytes`` (base64),
    enums (their value), tuples and sets (lists), dataclasses, attrs classes and
    ``msgspec.Struct`` (objects), and pydantic models (``model_dump(mode="json")``);
    decodes all of them back from what it stored, given the type.

    ``encoders`` and ``decoders`` add types of your own: ``{Money: str}`` and
    ``{Money: Money.parse}``; an encoder returns plain JSON (or types this codec
    encodes), a decoder takes the plain value. They are also looked up for a subclass.

    Raises:
        InvalidArgumentError: ``encoders`` or ``decoders`` is not a mapping of types to
            callables.
    """

    __slots__ = ("_decoders", "_encoders")

    def __init__(
        self,
        *,
        encoders: Mapping[type, Callable[[Any], Any]] | None = None,
        decoders: Mapping[type, Callable[[Any], Any]] | None = None,
    ) -> None:
        self._encoders = _hooks(encoders, "encoders")
        self._decoders = _hooks(decoders, "decoders")

    def __repr__(self) -> str:
        added = sorted({kind.__name__ for kind in (*self._encoders, *self._decoders)})
        return f"TypedCodec({', '.join(added)})" if added else "TypedCodec()"

    def encode(self, value: Any) -> Any:
        """``value`` as plain JSON types (see the class).

        Raises:
            InvalidValueError: a type this codec cannot encode, or an encoder that raised.
        """
        try:
            return _lists(_msgspec().to_builtins(value, enc_hook=self._encode_other))
        except InvalidValueError:  # a hook's failure, its cause chained
            raise
        except (TypeError, ValueError) as exc:  # msgspec's "unsupported type", a hook's
            raise InvalidValueError(f"value is not storable JSON: {exc}") from None
        except RecursionError:  # a cycle, or nesting past Python's own limit
            raise InvalidValueError("value is nested too deep (or holds a cycle)") from None

    def decode(self, value: Any, type: Any) -> Any:  # noqa: A002 - as get(type=) names it
        """``value`` as ``type``: a class, or a type hint such as ``list[Order]``.

        Raises:
            TypeMismatchError: ``value`` does not fit ``type``.
        """
        msgspec = _msgspec()
        try:
            return msgspec.convert(value, type, dec_hook=self._decode_other)
        except msgspec.ValidationError as exc:
            raise TypeMismatchError(f"the value does not fit {_name(type)}: {exc}") from None
        except TypeError as exc:  # a type msgspec cannot build, with no decoder for it
            raise TypeMismatchError(f"cannot decode into {_name(type)}: {exc}") from None

    def _encode_other(self, value: Any) -> Any:
        """msgspec's hook for a type it does not know."""
        encode = _lookup(self._encoders, type(value))
        if encode is not None:
            try:
                return encode(value)
            except Exception as exc:  # the user's hook: its failure is a bad value
                raise InvalidValueError(
                    f"the encoder of {type(value).__name__} raised {exc!r}"
                ) from exc
        dump = getattr(value, "model_dump", None)  # a pydantic model
        if dump is not None and callable(getattr(type(value), "model_validate", None)):
            return dump(mode="json")
        raise TypeError(
            f"{type(value).__name__} is not a JSON type, and this codec has no encoder for it"
        )

    def _decode_other(self, kind: type, value: Any) -> Any:
        """msgspec's hook for a type it cannot build."""
        decode = _lookup(self._decoders, kind)
        if decode is not None:
            try:
                return decode(value)
            except Exception as exc:  # the user's hook: its failure is a misfit
                raise ValueError(f"the decoder of {kind.__name__} raised {exc!r}") from exc
        validate = getattr(kind, "model_validate", None)  # a pydantic model
        if callable(validate):
            return validate(value)
        raise NotImplementedError(f"no decoder for {kind.__name__}")


def _hooks(
    given: Mapping[type, Callable[[Any], Any]] | None, name: str
) -> Mapping[type, Callable[[Any], Any]]:
    """``given`` checked, as a read-only copy.

    Raises:
        InvalidArgumentError: not a mapping of types to callables.
    """
    if given is None:
        return MappingProxyType({})
    if not isinstance(given, Mapping):
        raise InvalidArgumentError(f"{name} must be a mapping of types to callables")
    for kind, hook in given.items():
        if not isinstance(kind, type) or not callable(hook):
            raise InvalidArgumentError(
                f"{name} must map types to callables, not {kind!r} to {hook!r}"
            )
    return MappingProxyType(dict(given))


def _lookup(hooks: Mapping[type, Callable[[Any], Any]], kind: type) -> Callable[[Any], Any] | None:
    """The hook for ``kind``, or for its nearest base class that has one."""
    if not hooks:
        return None
    for base in getattr(kind, "__mro__", (kind,)):
        hook = hooks.get(base)
        if hook is not None:
            return hook
    return None


def _lists(value: Any) -> Any:
    """``value`` with tuples as lists: msgspec's builtins keep tuples, JSON has none."""
    kind = type(value)
    if kind is dict:
        return {key: _lists(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [_lists(item) for item in value]
    return value


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or repr(kind)


_loaded: ModuleType | None = None


def _msgspec() -> ModuleType:
    """msgspec, imported on first use (most programs never encode a typed value)."""
    global _loaded  # noqa: PLW0603 - a module imported once, on demand
    if _loaded is None:
        import msgspec

        _loaded = msgspec
    return _loaded


_default: TypedCodec | None = None
_default_lock = threading.Lock()


def default_codec() -> TypedCodec:
    """The codec that decodes ``get(type=...)`` on a handle opened without one."""
    global _default  # noqa: PLW0603 - one shared instance, made on first use
    with _default_lock:
        if _default is None:
            _default = TypedCodec()
        return _default


def check_codec(codec: object) -> Codec | None:
    """``codec`` if it is None or a codec.

    Raises:
        InvalidArgumentError: it has no ``encode`` and ``decode`` methods.
    """
    if codec is None or isinstance(codec, Codec):
        return codec
    raise InvalidArgumentError(
        f"codec must have encode(value) and decode(value, type) methods, not {codec!r}"
    )
