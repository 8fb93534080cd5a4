"""The public namespace and the error tree."""

from __future__ import annotations

import inspect
import itertools
import pickle
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import pytest

import reactor
from reactor import errors


def test_all_lists_exactly_the_public_names() -> None:
    assert reactor.open  # the first public name asked for loads them all (startup)
    public = {name for name in vars(reactor) if not name.startswith("_")}
    # public submodules that are imported on demand only
    modules = {"cli", "metrics", "testing", "ui"}
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

    assert reactor.__version__ == version("reactor-state")


def test_missing_is_a_singleton_with_a_clear_repr() -> None:
    assert repr(reactor.MISSING) == "reactor.MISSING"
    assert reactor.MISSING is reactor.Missing.MISSING


def test_aio_open_takes_the_options_of_open() -> None:
    import reactor.aio

    sync = inspect.signature(reactor.open, eval_str=True).parameters
    asynchronous = inspect.signature(reactor.aio.open, eval_str=True).parameters
    assert list(asynchronous.values()) == list(sync.values())


def test_public_classes_say_where_users_find_them() -> None:
    import reactor.aio
    import reactor.codecs

    for module in (reactor, reactor.aio, reactor.codecs, errors):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type | types.FunctionType):
                home = value.__module__
                assert not any(part.startswith("_") for part in home.split(".")), name
                assert getattr(sys.modules[home], value.__name__) is value
            if isinstance(value, type):
                typing.get_type_hints(value)  # the annotations resolve from there too
    change = reactor.Change(None, {"n": 1})
    assert pickle.loads(pickle.dumps(change)) == change  # noqa: S301 - our own bytes
    assert pickle.loads(pickle.dumps(reactor.MISSING)) is reactor.MISSING  # noqa: S301


# -- the API reference ----------------------------------------------------------------
REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
# mkdocstrings' default: members whose name starts with one underscore are not shown.
DEFAULT_FILTERS = ("!^_[^_]",)


def directives() -> dict[str, dict[str, Any]]:
    """The ``::: path`` directives of the reference pages, with their options."""
    yaml = pytest.importorskip("yaml")
    found: dict[str, dict[str, Any]] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            if line.startswith("::: "):
                block = itertools.takewhile(lambda text: text.startswith(" "), lines[index + 1 :])
                config = yaml.safe_load(textwrap.dedent("\n".join(block))) or {}
                found[line.removeprefix("::: ").strip()] = config.get("options", {})
    return found


def shown(name: str, options: dict[str, Any], documented: bool) -> bool:
    """Whether a module or class directive with ``options`` renders its member ``name``,
    as mkdocstrings does: by its ``members`` and ``filters``, and only with a docstring
    unless ``show_if_no_docstring``."""
    members = options.get("members", True)
    if members is False or (isinstance(members, list) and name not in members):
        return False
    for pattern in options.get("filters", DEFAULT_FILTERS):
        negated = pattern.startswith("!")
        if bool(re.search(pattern.removeprefix("!"), name)) == negated:
            return False
    return documented or bool(options.get("show_if_no_docstring"))


@pytest.fixture(scope="module")
def source() -> Any:
    """reactor as mkdocstrings reads it (griffe, from the source): its docstrings."""
    griffe = pytest.importorskip("griffe")
    return griffe.load("reactor", search_paths=[str(REFERENCE.parent.parent)])


def documented(source: Any, path: str) -> Any:
    """The object at ``path`` (``reactor.X.Y``) as the reference renders it."""
    return source if path == "reactor" else source[path.removeprefix("reactor.")]


def test_the_api_reference_shows_every_public_name(source: Any) -> None:
    import reactor.aio

    found = directives()
    page = (REFERENCE / "api.md").read_text(encoding="utf-8")
    missing = []
    for module in (reactor, reactor.aio, errors, reactor.ops, reactor.signals):
        for name in module.__all__:
            value = getattr(module, name)
            if name == "__version__":
                ok = "`reactor.__version__`" in page
            elif f"{module.__name__}.{name}" in found:
                ok = True
            else:  # rendered as a member of the module that defines it
                home = getattr(value, "__module__", module.__name__)
                if not isinstance(value, type | types.FunctionType) or home not in found:
                    home = module.__name__
                docstring = documented(source, f"{home}.{name}").docstring
                ok = home in found and shown(name, found[home], docstring is not None)
            if not ok:
                missing.append(f"{module.__name__}.{name}")
    assert missing == [], "add a ::: directive to docs/reference/api.md"


def test_the_api_reference_shows_docstrings_and_no_private_name(source: Any) -> None:
    problems = []
    for path, options in directives().items():
        found = documented(source, path)
        if not found.docstring and not options.get("show_if_no_docstring"):
            problems.append(f"{path}: no docstring")
        if not found.is_class:
            continue
        if options.get("show_bases", True):
            problems.extend(
                f"{path}: private base {base}"
                for base in map(str, found.bases)
                if base.rsplit(".", 1)[-1].startswith("_")
            )
        members = found.all_members if options.get("inherited_members") else found.members
        for name, member in members.items():
            if name.startswith("_") or not shown(name, options, documented=True):
                continue
            if (member.is_function or "property" in member.labels) and not member.docstring:
                problems.append(f"{path}.{name}: no docstring")
    assert problems == []
