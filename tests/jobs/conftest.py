"""Fixtures of the jobs app's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.outputs_helpers import file_store


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory artifact store that ``ARTIFACT_URL`` names for the test."""
    root, settings_override, _ = file_store(tmp_path)
    with settings_override:
        yield root


@pytest.fixture
def artifacts_in_tmp(tmp_path: Path, settings: Any) -> None:
    """``ARTIFACT_URL`` under the test's ``tmp_path`` (code bundles, checkpoints); a module
    uses it with ``pytest.mark.usefixtures("artifacts_in_tmp")``."""
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"
