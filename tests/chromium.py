"""Debian's Chromium for the browser tests, headless, through Playwright (never a
downloaded browser): the one launch the browser fixtures share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.browser import CHROMIUM, CHROMIUM_ARGS


@contextlib.contextmanager
def launched_chromium() -> Iterator[Any]:
    """A running headless Chromium, closed on exit; the test is skipped when it is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
