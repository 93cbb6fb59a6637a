"""The checkers see everything: mypy every package (none exempt), pytest every test folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.architecture.imports import LAYERS

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_checks_every_package_and_exempts_no_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert set(config["files"]) == set(LAYERS)
    exempt = [o["module"] for o in config.get("overrides", []) if o.get("ignore_errors")]
    assert exempt == [], "shrink-only: fix the module instead of exempting it"


def test_testpaths_name_only_folders_that_exist() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    paths = config["tool"]["pytest"]["ini_options"]["testpaths"]
    assert paths and all((ROOT / path).is_dir() for path in paths)
