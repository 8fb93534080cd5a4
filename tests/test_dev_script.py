"""``dev.py``, the README's two commands: the demo installs reactor with its runtime
dependencies only, the tests with every extra; each once per ``pyproject.toml``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, list[list[str]]]:
    """dev.py with its environment in ``tmp_path`` and its commands recorded, not run
    (pip would install for real; the fresh-clone check runs the real thing)."""
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    venv = tmp_path / ".venv"
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    monkeypatch.setattr(module, "VENV", venv)
    monkeypatch.setattr(module, "BIN", bin_dir)
    monkeypatch.setattr(module, "STAMP", venv / ".reactor-installed")
    monkeypatch.setattr(module, "RUNTIME_STAMP", venv / ".reactor-installed-runtime")
    ran: list[list[str]] = []
    monkeypatch.setattr(module, "run", lambda *command: ran.append([str(c) for c in command]))
    return module, ran


def _installs(ran: list[list[str]]) -> list[str]:
    return [command[-1] for command in ran if "install" in command and "-e" in command]


def test_the_demo_installs_the_runtime_dependencies_only_and_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, ran = _dev(tmp_path, monkeypatch)
    dev.ensure_environment(full=False)
    assert _installs(ran) == ["."]
    dev.ensure_environment(full=False)
    assert _installs(ran) == ["."]  # done for this pyproject.toml


def test_the_tests_install_every_extra_and_then_serve_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, ran = _dev(tmp_path, monkeypatch)
    dev.ensure_environment(full=False)
    dev.ensure_environment(full=True)
    assert _installs(ran) == [".", ".[dev,bench,metrics,postgresql,ui]"]
    dev.ensure_environment(full=False)  # the full install has what the demo needs
    dev.ensure_environment(full=True)
    assert len(_installs(ran)) == 2


def test_main_installs_by_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev, ran = _dev(tmp_path, monkeypatch)
    seen: list[Any] = []
    monkeypatch.setattr(dev, "ensure_environment", lambda **kwargs: seen.append(kwargs))
    dev.main(["demo"])
    dev.main(["pytest", "-q"])
    assert seen == [{"full": False}, {"full": True}]
    assert ran[0][1:] == ["demo"]  # .venv/bin/reactor demo
    assert ran[1][1:] == ["-m", "pytest", "-q"]
