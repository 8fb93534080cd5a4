#!/usr/bin/env python3
"""Set up and run reactor from a fresh checkout, with nothing but python3.

    python3 dev.py demo           run the demo
    python3 dev.py test [-- ARGS] lint (ruff), types (mypy --strict), docs (mkdocs
                                  --strict), then the test suite (pytest ARGS) on
                                  SQLite and, at the same time, on PostgreSQL when
                                  $REACTOR_TEST_POSTGRES_URL names a server
    python3 dev.py pytest ARGS    the test suite alone

The virtual environment lives in .venv; it is (re)installed when pyproject.toml changes:
with reactor's runtime dependencies only for the demo, with every extra for the rest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".reactor-installed"  # the full install (the tests', the bench's extras)
RUNTIME_STAMP = VENV / ".reactor-installed-runtime"  # reactor and its dependencies only
POSTGRES_ENV = "REACTOR_TEST_POSTGRES_URL"


def run(*command: str | Path) -> None:
    print("+", " ".join(str(part) for part in command), flush=True)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([str(part) for part in command], cwd=ROOT, env=env, check=False)
    if done.returncode != 0:
        sys.exit(done.returncode)


def ensure_environment(*, full: bool = True) -> None:
    """Create .venv and install reactor into it, if not done for this pyproject: with
    its runtime dependencies only for the demo (seconds), with the extras the tests and
    the bench need (``full``) for the rest. A full install serves the demo too."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return  # the full install: it has everything
    if not full and RUNTIME_STAMP.exists() and RUNTIME_STAMP.read_text() == digest:
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    if full:
        run(BIN / "python", "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        run(
            BIN / "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "-e",
            ".[dev,bench,metrics,postgresql,ui]",
        )
        STAMP.write_text(digest)
    else:
        run(
            BIN / "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            ".",
        )
        RUNTIME_STAMP.write_text(digest)


def both_passes(rest: list[str]) -> None:
    """The suite on SQLite and on PostgreSQL, at the same time: much of a test's time is
    spent waiting (for another process, a server, a timer), so two passes on two cores
    take little longer than the longer one. The SQLite pass prints as it goes; the
    PostgreSQL pass's output follows it. ``$REACTOR_TEST_ONE_PASS_AT_A_TIME=1`` runs
    them one after the other instead."""
    sqlite: list[str | Path] = [BIN / "python", "-m", "pytest", *rest]
    postgresql: list[str | Path] = [BIN / "python", "-m", "pytest", "--backend=postgresql", *rest]
    if os.environ.get("REACTOR_TEST_ONE_PASS_AT_A_TIME"):
        run(*sqlite)
        run(*postgresql)
        return
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "postgresql.log"
        command = [*postgresql, "--basetemp", str(Path(scratch) / "tmp")]
        print("+", " ".join(map(str, command)), "(at the same time; its output follows)")
        with log.open("wb") as output:
            other = subprocess.Popen(
                [str(part) for part in command],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            try:
                print("+", " ".join(map(str, sqlite)), flush=True)
                first = subprocess.run(
                    [str(part) for part in sqlite], cwd=ROOT, env=env, check=False
                )
                second = other.wait()
            finally:
                if other.poll() is None:
                    other.terminate()
                    other.wait()
        print("\n--- the PostgreSQL pass ---", flush=True)
        sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
        sys.stdout.flush()
    failed = [name for name, code in (("SQLite", first.returncode), ("PostgreSQL", second)) if code]
    if failed:
        print(f"failed: the {' and the '.join(failed)} pass", flush=True)
        sys.exit(1)


def main(argv: list[str]) -> None:
    command, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    ensure_environment(full=command != "demo")
    if command == "demo":
        run(BIN / "reactor", "demo", *rest)
    elif command == "test":
        run(BIN / "ruff", "check", ".")
        run(BIN / "ruff", "format", "--check", ".")
        run(BIN / "mypy", "reactor", "tests/typing_examples.py")
        with tempfile.TemporaryDirectory() as site:
            run(BIN / "mkdocs", "build", "--strict", "--quiet", "--site-dir", site)
        if os.environ.get(POSTGRES_ENV):
            both_passes(rest)
        else:
            run(BIN / "python", "-m", "pytest", *rest)
            print(f"the PostgreSQL pass did not run: ${POSTGRES_ENV} is not set", flush=True)
    elif command == "pytest":
        run(BIN / "python", "-m", "pytest", *rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
