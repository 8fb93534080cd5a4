"""The public namespace and the error tree."""

from __future__ import annotations

import reactor
from reactor import errors


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(reactor) if not name.startswith("_")}
    modules = {"cli"}  # public submodules that are imported on demand only
    assert set(reactor.__all__) - {"__version__"} == public - modules


def test_every_error_is_a_reactor_error_and_exported() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, reactor.ReactorError)
        assert getattr(reactor, name) is cls


def test_errors_subclass_the_builtin_the_spec_names() -> None:
    assert issubclass(reactor.InvalidValueError, ValueError)
    assert issubclass(reactor.InvalidKeyError, ValueError)
    assert issubclass(reactor.InvalidArgumentError, ValueError)
    assert issubclass(reactor.InvalidOpError, ValueError)
    assert issubclass(reactor.TypeMismatchError, TypeError)
    assert issubclass(reactor.LockTimeout, TimeoutError)
    assert issubclass(reactor.BusyError, reactor.StorageError)
    assert issubclass(reactor.BusyError, TimeoutError)


def test_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    assert reactor.__version__ == version("reactor")


def test_missing_is_a_singleton_with_a_clear_repr() -> None:
    assert repr(reactor.MISSING) == "reactor.MISSING"
    assert reactor.MISSING is reactor.Missing.MISSING
