"""Logging: the library adds only a ``NullHandler``; the command line, an application,
shows reactor's warnings on stderr; and docs/guides/logging.md names every message
reactor logs, at its level, so that the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.conftest import CLI_ENV

ROOT: Final = Path(__file__).resolve().parent.parent
PAGE: Final = ROOT / "docs" / "guides" / "logging.md"
LEVELS: Final = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "error": "ERROR",
    "exception": "ERROR",  # with the traceback
    "critical": "CRITICAL",
}
# A %-style placeholder of the code; the page names what goes there: <scope>, <file>.
_PLACEHOLDER: Final = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifgx]")
_NAMED: Final = r"<[^<>`]+>"
# An entry of the page: - **WARNING** `message`
_ENTRY: Final = re.compile(r"^- \*\*(?P<level>[A-Z]+)\*\* `(?P<message>[^`]+)`", re.MULTILINE)


@dataclass(frozen=True)
class Call:
    """A ``logger.<level>("message", ...)`` call of reactor's code."""

    where: str  # path:line
    logger: str  # the name given to logging.getLogger
    level: str
    message: str

    def matches(self, shown: str) -> bool:
        """Whether ``shown``, the page's text of a message, is this call's message,
        with each placeholder named (``<scope>``)."""
        literal = _PLACEHOLDER.split(self.message)
        pattern = _NAMED.join(re.escape(part) for part in literal)
        return re.fullmatch(pattern, shown) is not None


def _logger_names(tree: ast.Module) -> dict[str, str]:
    """The module's ``NAME = logging.getLogger("...")``: NAME -> the logger's name."""
    names: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "getLogger"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = str(node.value.args[0].value)
    return names


def logger_calls() -> list[Call]:
    """Every call of a module's logger in reactor/, its message as written."""
    calls: list[Call] = []
    for path in sorted((ROOT / "reactor").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        loggers = _logger_names(tree)
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in loggers
                and node.func.attr in LEVELS
            ):
                continue
            first = node.args[0] if node.args else None
            # A constant, so that the page can name it (and logging formats it lazily).
            assert isinstance(first, ast.Constant), f"{where}:{node.lineno}: not a constant"
            assert isinstance(first.value, str)
            calls.append(
                Call(
                    f"{where}:{node.lineno}",
                    loggers[node.func.value.id],
                    LEVELS[node.func.attr],
                    first.value,
                )
            )
    return calls


def page_entries() -> list[tuple[str, str]]:
    """The (level, message) of every entry of the page."""
    text = PAGE.read_text(encoding="utf-8")
    return [(found["level"], found["message"]) for found in _ENTRY.finditer(text)]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; its output."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=CLI_ENV,
    )


def test_reactor_adds_a_null_handler_and_nothing_else() -> None:
    done = _run(
        """
        import logging
        import reactor, reactor.aio, reactor.cli
        print([type(handler).__name__ for handler in logging.getLogger("reactor").handlers])
        """
    )
    assert done.stdout == "['NullHandler']\n"


def test_a_program_that_configures_no_logging_prints_nothing_of_reactors() -> None:
    # Without the NullHandler, logging's last resort would print this warning on stderr.
    done = _run(
        """
        import logging
        import reactor
        logging.getLogger("reactor").warning("never shown")
        """
    )
    assert done.stderr == ""


def test_the_command_line_shows_reactors_warnings_on_stderr() -> None:
    done = _run(
        """
        import logging, sys
        sys.argv = ["reactor", "--version"]
        from reactor.cli import main
        try:
            main()
        except SystemExit:
            pass
        logging.getLogger("reactor").warning("shown")
        logging.getLogger("reactor").info("not shown")
        """
    )
    assert done.stderr == "shown\n"


def test_every_logged_message_is_on_the_page_at_its_level() -> None:
    calls = logger_calls()
    assert len(calls) > 30, calls  # the parse found them
    entries = page_entries()
    missing = [
        f"{call.where}: {call.level} {call.message!r}"
        for call in calls
        if not any(level == call.level and call.matches(shown) for level, shown in entries)
    ]
    assert not missing, f"{PAGE.name} does not name these messages (at their level): {missing}"


def test_the_page_names_no_message_that_the_code_no_longer_logs() -> None:
    calls = logger_calls()
    stale = [
        f"{level} {shown!r}"
        for level, shown in page_entries()
        if not any(call.level == level and call.matches(shown) for call in calls)
    ]
    assert not stale, f"{PAGE.name} names messages no code logs: {stale}"


def test_the_page_names_every_logger_the_messages_go_to() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for name in {call.logger for call in logger_calls()}:
        assert f"`{name}`" in text, name
