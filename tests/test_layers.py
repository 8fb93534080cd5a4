"""The shape of the package (issue 23): one door for writes.

Every commit goes through the engine (``reactor/_engine/engine.py``), which publishes
what it changed: a module that called the store's ``write`` or a scope's mailbox itself
could forget to publish, and its subscribers would never hear of the write."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reactor"
DOORS = {"write", "mailbox", "_mailbox", "Mailbox"}  # store.write, or a mailbox


def _door_calls(source: str) -> list[tuple[int, str]]:
    """The calls in ``source`` of a store's ``write`` or of a mailbox: (line, as written)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        last = name.split(".")[-1]
        if last in DOORS and (last != "write" or name.split(".")[-2:-1] in (["store"], ["_store"])):
            found.append((node.lineno, name))
    return found


def test_nothing_but_the_engine_calls_the_store_s_write_or_a_mailbox() -> None:
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name not in {"_engine", "_storage"}
        for line, name in _door_calls(path.read_text())
    ]
    assert outside == []


def test_the_check_finds_the_calls_it_forbids() -> None:
    source = (
        "engine.store.write(work, now)\n"
        "self._engine._mailbox('s').submit(w, 's')\n"
        "Mailbox('m', store, clock, hook)\n"
        "engine.write('s', work)\n"  # the door itself: allowed
        "handle.write(data)\n"
    )
    assert sorted(line for line, _ in _door_calls(source)) == [1, 2, 3]


def _imported_names(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every ``from module import name`` in ``path`` (type-only
    imports included), the module made absolute."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = list(parts if path.name == "__init__.py" else parts[:-1])
    if path.name == "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.update((module, alias.name) for alias in node.names)
    return found


def test_features_use_the_engine_s_port_not_its_class() -> None:
    """Only what builds engines and binds handles to them knows the concrete class;
    everything else is written against ``EnginePort``."""
    builders = {"registry.py", "binding.py", "state.py"}
    knowing = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "_engine" and path.name not in builders
        if ("reactor._engine.engine", "Engine") in _imported_names(path)
    )
    assert knowing == []
    assert ("reactor._engine.engine", "Engine") in _imported_names(
        PACKAGE / "_handles" / "registry.py"
    )  # the check sees the one that does
