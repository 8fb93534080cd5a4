"""The suite's own layout: tests go through the public API and ``reactor.testing``;
only the files listed in ``tests/README.md`` import reactor's private modules, each for
a reason it gives there."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Final

TESTS: Final = Path(__file__).resolve().parent

# The files that import private modules on purpose (tests/README.md says why).
ON_PURPOSE: Final = {
    "conftest.py",  # the one door to an engine's insides, and the registry's clean-up
    "test_internals.py",  # engine internals, on purpose
    "test_storage.py",  # storage, on purpose: SQL text, group commit, PostgreSQL
}


def private_imports(path: Path) -> set[str]:
    """The private reactor modules ``path`` imports, anywhere in it (a function's
    imports too); not those named in strings (a child process's program)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            found.add(node.module)
            if node.module == "reactor":
                found.update(f"reactor.{alias.name}" for alias in node.names)
    return {name for name in found if _private(name)}


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "reactor" and any(part.startswith("_") for part in parts[1:])


def test_only_the_files_listed_import_private_modules() -> None:
    importing = {path.name for path in TESTS.glob("*.py") if private_imports(path)}
    assert sorted(importing - ON_PURPOSE) == []


def test_the_check_sees_every_kind_of_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import reactor._base.keys\n"
        "from reactor._handles.binding import engine_of\n"
        "from reactor import _version\n"
        "def f():\n"
        "    from reactor._storage import schema\n"
        "CHILD = 'from reactor._base.values import encode'\n"
        "import reactor.testing\n"
        "from reactor.aio import open\n"
    )
    assert private_imports(sample) == {
        "reactor._base.keys",
        "reactor._handles.binding",
        "reactor._version",
        "reactor._storage",
    }


def test_the_readme_lists_the_files_that_import_private_modules() -> None:
    readme = (TESTS / "README.md").read_text()
    listed = set(re.findall(r"^- `([\w.]+\.py)`", readme, flags=re.MULTILINE))
    assert listed == ON_PURPOSE
