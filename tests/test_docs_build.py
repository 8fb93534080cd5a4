"""The documentation's build, as ``python3 dev.py test`` runs it (its ``mkdocs``
arguments, its environment), fails on a broken link, an anchor that no page has
included, and prints nothing but mkdocs's own log lines when all is well: no theme
banner. Checked on a small site of two pages built with the settings of the
repository's ``mkdocs.yml`` (its theme, Markdown extensions and ``validation:``), so
that the check cannot stop working unnoticed: by a setting taken out, an option that
hides the warnings ``--strict`` counts (``--quiet`` does), or a new mkdocs that checks
less by default."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
MKDOCS: Final = Path(sys.executable).parent / "mkdocs"
OTHER: Final = "# Other\n\n## Here it is\n\nText.\n"

pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed")


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(tmp_path: Path, index: str) -> subprocess.CompletedProcess[str]:
    """The build ``dev.py test`` runs, of a site of two pages (``index.md``,
    ``other.md``) with the repository's settings but its own nav."""
    yaml = pytest.importorskip("yaml")
    settings: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    settings.pop("plugins")  # mkdocstrings: the API page only
    settings["nav"] = [{"Home": "index.md"}, {"Other": "other.md"}]
    settings["docs_dir"] = str(tmp_path / "docs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\n{index}\n", encoding="utf-8")
    (tmp_path / "docs" / "other.md").write_text(OTHER, encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    site = tmp_path / "site"
    dev = _dev()
    command = [MKDOCS, *dev.DOCS_BUILD, "--config-file", config, "--site-dir", site]
    return subprocess.run(
        [str(part) for part in command],
        cwd=ROOT,  # pymdownx.snippets' base_path
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dev.environment(),
    )


@pytest.mark.parametrize(
    ("link", "complaint"),
    [
        ("[there](other.md#no-such-heading)", "'other.md#no-such-heading'"),
        ("[below](#no-such-heading)", "'#no-such-heading'"),
        ("[gone](gone.md)", "'gone.md'"),
        ("[source](../reactor/__init__.py)", "'../reactor/__init__.py'"),
        ("[root](/other.md)", "'/other.md'"),
    ],
)
def test_a_broken_link_fails_the_strict_build(tmp_path: Path, link: str, complaint: str) -> None:
    done = _build(tmp_path, f"See {link}.")
    printed = done.stdout + done.stderr
    assert done.returncode != 0, printed
    assert complaint in printed
    assert "Aborted with 1 warnings in strict mode" in printed


def test_good_links_build_and_the_build_prints_only_its_log(tmp_path: Path) -> None:
    done = _build(tmp_path, "See [there](other.md#here-it-is) and [other](other.md).")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "other" / "index.html").is_file()
    printed = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert printed  # "Building documentation to directory: ..."
    for line in printed:  # no warning, and no theme's end-of-life banner
        assert line.startswith("INFO    -  "), printed
