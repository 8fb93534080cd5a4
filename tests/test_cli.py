"""The command line, driven as a user would: in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import reactor


def _reactor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_version(tmp_path: Path) -> None:
    done = _reactor("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == f"reactor, version {reactor.__version__}"


def test_the_console_script_is_installed() -> None:
    script = shutil.which("reactor", path=str(Path(sys.executable).parent))
    assert script is not None


def test_errors_are_one_line_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "not-a-db").write_text("this is not a database" * 100)
    done = _reactor("demo", "--db", str(tmp_path / "not-a-db"), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("reactor: ")
    assert "Traceback" not in done.stderr
