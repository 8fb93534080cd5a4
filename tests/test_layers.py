"""The shape of the package (issue 23): one door for writes, layers, sizes.

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


# -- layers and circles ----------------------------------------------------------------
# A module imports from its own layer and those below it only. The public namespace
# (``reactor``) sits on the layers; what is built on the public API sits above it.
RANKS = {
    "reactor.errors": 0,
    "reactor.ops": 0,
    "reactor.signals": 0,
    "reactor._version": 0,
    "reactor._base": 1,
    "reactor._storage": 2,
    "reactor._engine": 3,
    "reactor._work": 4,
    "reactor._handles": 5,
    "reactor._backup": 6,
    "reactor.aio": 6,
    "reactor": 7,
    "reactor.cli": 8,
    "reactor._ui": 8,
    "reactor._bench": 8,
    "reactor.testing": 8,
    "reactor.metrics": 8,
    "reactor.ui": 9,
    "reactor.__main__": 9,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int:
    """The layer of ``module``: that of the longest prefix named in ``RANKS``."""
    while module not in RANKS:
        module = module.rpartition(".")[0]
    return RANKS[module]


def _graph() -> dict[str, set[str]]:
    """Module -> the reactor modules it imports (type-only imports included)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for module, imported in _imported_names(path):
            if f"{module}.{imported}" in modules:
                found.add(f"{module}.{imported}")
            elif module in modules:
                found.add(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
        graph[name] = found - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_module_imports_only_from_its_layer_and_below() -> None:
    upward = sorted(
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        for imported in imports
        if _rank(imported) > _rank(module)
    )
    assert upward == []


# -- sizes: a module is read whole, a function at a glance -------------------------------
MODULE_LINES = 600
FUNCTION_LINES = 60


def _too_long(path: Path) -> list[str]:
    """The module ``path`` if over ``MODULE_LINES`` lines, and its functions (docstrings
    included) over ``FUNCTION_LINES``."""
    source = path.read_text()
    found = []
    if len(source.splitlines()) > MODULE_LINES:
        found.append(f"{path.name}: {len(source.splitlines())} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_module_over_600_lines_and_no_function_over_60() -> None:
    found = [item for path in sorted(PACKAGE.rglob("*.py")) for item in _too_long(path)]
    assert found == []


def test_the_size_check_finds_what_is_too_long(tmp_path: Path) -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(FUNCTION_LINES))
    sample = tmp_path / "sample.py"
    sample.write_text(f"def long():\n{body}\n" + "\n" * MODULE_LINES)
    assert _too_long(sample) == [
        f"sample.py: {FUNCTION_LINES + 1 + MODULE_LINES} lines",
        f"sample.py:1 long: {FUNCTION_LINES + 1} lines",
    ]
