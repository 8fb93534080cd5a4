"""The snippets of docs/ and of the README run, as a reader would run them.

Every ```python block runs. The conventions, in the Markdown source:

- **A page's blocks run in order, in one namespace**, in a fresh folder (the current
  directory) with ``$REACTOR_DB`` pointing into it: a block may use what the blocks
  above it on its page defined (``state``, ``orders``), as a reader following the page
  would. Each page runs in an interpreter of its own.
- **A statement that should fail says so**: a top-level statement whose comment starts
  with an error's name (``s.set("", 1)  # InvalidKeyError: ...``) must raise that error
  (or a subclass), and the page goes on.
- **A block with a top-level ``await``** (``async with``, ``async for``) runs as in
  ``python -m asyncio``: in ``asyncio.run``.
- **A block with ``if __name__ == "__main__":``** is a program: it is written to a file
  and run as one (``python FILE``), so that ``multiprocessing``'s spawn finds its
  functions.
- ``<!-- setup`` ... ``-->``, a comment that the page does not show, holds code run at
  that point: stand-ins for the reader's own functions (``deploy()``, ``charge()``).
- ``<!-- not run: REASON -->`` right before a block leaves it out. ``NOT_RUN`` lists
  every such block, so that leaving one out is a deliberate, visible choice.
- A block that is only ``--8<-- "examples/NAME.py"`` includes a program of
  ``examples/``, which ``tests/test_examples.py`` runs.

The ``$ reactor ...`` commands of ```console blocks run too, in order, page by page, on
a fresh database: each must succeed, or fail with the error the page shows after it
(``Error: ...``). Their other output is not compared (timestamps, paths and values
depend on what ran before). Commands that do not end by themselves (``watch`` without
``--limit``, ``ui``, ``serve``) or take minutes (``bench``, ``demo``), and lines with pipes,
redirections or other programs, are skipped. ```sh blocks (installation, ``dev.py``,
``reactor bench``) are not run.
"""

from __future__ import annotations

import ast
import asyncio
import faulthandler
import inspect
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
PAGES: Final = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TIMEOUT: Final = 60  # seconds for one block; a page takes a few at most

# The blocks left out: (page, reason). Keep it short.
NOT_RUN: Final = [
    (
        "docs/guides/cli.md",
        "needs a database the user may read but not write (tests/test_readonly.py runs it)",
    ),
    ("docs/guides/cli.md", "needs a damaged backup file"),
    ("docs/guides/dashboard.md", "FastAPI is not among the tests' dependencies"),
    ("docs/guides/postgresql.md", "needs a PostgreSQL server"),
    ("docs/guides/postgresql.md", "needs a PostgreSQL server"),
]

_FENCE: Final = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w-]*)")
_NOT_RUN: Final = re.compile(r"^<!-- not run: (?P<reason>.+?) -->$")
_RAISES: Final = re.compile(r"^#\s*(?P<error>[A-Z]\w*(?:Error|Timeout|Exception))\b")
_MAIN: Final = re.compile(r'^if __name__ == "__main__":', re.MULTILINE)
_ENDLESS: Final = frozenset({"ui", "serve", "bench", "demo"})  # and watch without --limit
_SHELL: Final = frozenset("|&;<>()$`")  # shlex's punctuation: pipes, redirections


@dataclass(frozen=True)
class Block:
    """A ```python or ```console block of a page, or the code of a ``<!-- setup``."""

    page: str  # relative to the repository
    line: int  # of the block's first line of code, 1-based
    code: str
    kind: str  # "run", "setup", "program", "include", "console" or "not run"
    reason: str = ""


def _kind(lang: str, code: str, reason: str | None) -> str:
    if reason is not None:
        return "not run"
    if lang == "console":
        return "console"
    if code.strip().startswith("--8<--"):
        return "include"
    return "program" if _MAIN.search(code) else "run"


def blocks_of(page: Path) -> list[Block]:
    """The python and console blocks and the setup comments of ``page``, in order."""
    name = page.relative_to(ROOT).as_posix()
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    reason: str | None = None  # of a "not run" comment waiting for its block
    index = 0
    while index < len(lines):
        text = lines[index]
        if marker := _NOT_RUN.match(text.strip()):
            reason = marker["reason"]
        elif text.strip() == "<!-- setup":
            end = lines.index("-->", index)
            code = "\n".join(lines[index + 1 : end])
            found.append(Block(name, index + 2, code, "setup"))
            index = end
        elif fence := _FENCE.match(text):
            end = index + 1
            closing = fence["indent"] + fence["fence"]
            while not lines[end].startswith(closing):
                end += 1
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            if fence["lang"] in ("python", "console"):
                kind = _kind(fence["lang"], code, reason)
                found.append(Block(name, index + 2, code, kind, reason or ""))
            elif reason is not None:
                raise AssertionError(f"{name}:{index + 1}: 'not run' before a {fence['lang']}")
            reason = None
            index = end
        elif text.strip() and reason is not None:
            raise AssertionError(f"{name}:{index + 1}: 'not run' must come right before a block")
        index += 1
    return found


ALL: Final = {page.relative_to(ROOT).as_posix(): blocks_of(page) for page in PAGES}
RUN: Final = sorted(
    page for page, found in ALL.items() if any(b.kind in ("run", "program") for b in found)
)

pytestmark = pytest.mark.sqlite_only("the docs' snippets open SQLite files")


# -- the tests ---------------------------------------------------------------------
def test_every_block_is_found() -> None:
    for page in PAGES:
        fences = sum(
            line.lstrip().startswith(("```python", "```console"))
            for line in page.read_text(encoding="utf-8").splitlines()
        )
        found = ALL[page.relative_to(ROOT).as_posix()]
        assert fences == sum(block.kind != "setup" for block in found), page


def test_the_blocks_not_run_are_few_and_deliberate() -> None:
    left_out = [(b.page, b.reason) for found in ALL.values() for b in found if b.kind == "not run"]
    assert left_out == NOT_RUN


def test_included_programs_are_the_examples() -> None:
    included = {b.code.strip() for found in ALL.values() for b in found if b.kind == "include"}
    assert included
    for line in included:
        path = ROOT / line.removeprefix("--8<--").strip().strip('"')
        assert path.parent == ROOT / "examples", line  # run by tests/test_examples.py
        assert path.is_file(), line


def _environment(cwd: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "REACTOR_DB": str(cwd / "default" / "state.db"),
        "COLUMNS": "200",
    }


@pytest.mark.parametrize("page", RUN)
def test_the_python_blocks_of_a_page_run(page: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, __file__, page],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=4 * TIMEOUT,
        check=False,
        env=_environment(tmp_path),
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"


def test_a_statement_said_to_fail_must_fail() -> None:
    namespace: dict[str, Any] = {}
    _exec(Block("README.md", 1, 'n = int("x")  # ValueError: not a number', "run"), namespace)
    assert "n" not in namespace
    with pytest.raises(AssertionError, match="did not raise ValueError"):
        _exec(Block("README.md", 1, 'n = int("1")  # ValueError', "run"), namespace)
    with pytest.raises(ZeroDivisionError):  # not the error the comment names
        _exec(Block("README.md", 1, "n = 1 / 0  # ValueError", "run"), namespace)


def _split(command: str) -> list[str]:
    """Words as a POSIX shell splits them, with its operators (``|``, ``>``) as words
    of their own and comments left out; ValueError for an unclosed quote."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _commands(block: Block) -> list[tuple[int, list[str], str | None]]:
    """The ``$ reactor ...`` commands of a console block that can run here: (line, the
    arguments after ``reactor``, the error the page shows after it, if any)."""
    lines = block.code.splitlines()
    found = []
    for index, text in enumerate(lines):
        if not text.startswith("$ "):
            continue
        command = text[2:]
        following = index + 1
        while True:  # a quoted argument may go on over the next lines
            try:
                words = _split(command)
                break
            except ValueError:
                command += "\n" + lines[following]
                following += 1
        output = []
        while following < len(lines) and not lines[following].startswith("$ "):
            output.append(lines[following])
            following += 1
        errors = [line for line in output if line.startswith("Error: ")]
        skipped = (
            words[:1] != ["reactor"]
            or any(word and set(word) <= _SHELL for word in words)
            or "postgresql" in command
            or bool(_ENDLESS & set(words))
            or ("watch" in words and "--limit" not in words and "--count" not in words)
        )
        if not skipped:
            found.append((block.line + index, words[1:], errors[-1] if errors else None))
    return found


CONSOLE: Final = sorted(
    page
    for page, found in ALL.items()
    if any(_commands(block) for block in found if block.kind == "console")
)


@pytest.mark.parametrize("page", CONSOLE)
def test_the_commands_of_a_page_run(page: str, tmp_path: Path) -> None:
    for block in ALL[page]:
        if block.kind != "console":
            continue
        for line, args, error in _commands(block):
            done = subprocess.run(
                [sys.executable, "-m", "reactor", *args],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                env=_environment(tmp_path),
            )
            where = f"{page}:{line}: reactor {shlex.join(args)}"
            if error is None:
                assert done.returncode == 0, (where, done.stderr)
                continue
            assert done.returncode != 0, where
            shown = done.stderr.splitlines()[-1]
            # Paths differ from the page's: compared up to the first one.
            assert shown.startswith(error.partition("/")[0]), (where, shown, error)
            if "/" not in error:
                assert shown == error, where


# -- the runner: python tests/test_docs.py PAGE -----------------------------------
def _comments(code: str) -> dict[int, str]:
    """The comment on each line of ``code``, by line number (1-based)."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def _exec(block: Block, namespace: dict[str, Any]) -> None:
    """Run one block in ``namespace``, statement by statement; line numbers are the
    page's, so that a traceback points into the Markdown."""
    filename = str(ROOT / block.page)
    tree = ast.parse(block.code, filename)
    comments = _comments(block.code)
    ast.increment_lineno(tree, block.line - 1)
    # dont_inherit: the page's code runs as a reader's would, without this module's
    # ``from __future__ import annotations`` (a dataclass's annotations stay types).
    whole = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    if whole.co_flags & inspect.CO_COROUTINE:  # top-level await: as python -m asyncio
        asyncio.run(eval(whole, namespace))  # noqa: S307 - the docs' own code
        return
    for statement in tree.body:
        end = statement.end_lineno or statement.lineno
        expected = _RAISES.match(comments.get(end - block.line + 1, ""))
        code = compile(ast.Module([statement], []), filename, "exec", dont_inherit=True)
        if expected is None:
            exec(code, namespace)  # noqa: S102 - the docs' own code
            continue
        try:
            exec(code, namespace)  # noqa: S102
        except Exception as exc:
            if expected["error"] not in {kind.__name__ for kind in type(exc).__mro__}:
                raise
        else:
            where = f"{block.page}:{statement.lineno}"
            raise AssertionError(f"{where} did not raise {expected['error']}")


def _run(page: str) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in blocks_of(ROOT / page):
        print(f"-- {page}:{block.line} ({block.kind})", flush=True)
        faulthandler.dump_traceback_later(TIMEOUT, exit=True)
        if block.kind in ("run", "setup"):
            _exec(block, namespace)
        elif block.kind == "program":
            program = Path(f"program_{block.line}.py")
            program.write_text("\n" * (block.line - 1) + block.code, encoding="utf-8")
            subprocess.run([sys.executable, program], check=True, timeout=TIMEOUT)
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    _run(sys.argv[1])
