"""The package as users get it: a wheel named reactor-state, installed in a fresh
virtual environment, imports as ``reactor`` and runs the ``reactor`` command."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.sqlite_only("packaging is the same whatever the backend")
def test_the_wheel_installs_as_reactor_state_and_runs_the_cli(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("*.whl")
    assert wheel.name.startswith("reactor_state-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "reactor/__init__.py" in names
    assert "reactor/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert b"\nName: reactor-state\n" in metadata
    assert b"\nLicense-Expression: MIT\n" in metadata

    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python, command = env / "bin" / "python", env / "bin" / "reactor"
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600)
    db = str(tmp_path / "state.db")
    done = subprocess.run(
        [command, "--db", db, "set", "s", "k", '{"a": 1.5}'],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout.strip() == '{"old_value":null,"new_value":{"a":1.5}}'
    done = subprocess.run(
        [command, "--db", db, "get", "s", "k"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout.strip() == '{"a":1.5}'
    done = subprocess.run(
        [python, "-c", "import reactor; print(reactor.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout.strip() not in ("", "0.0.0")  # found under its distribution name
