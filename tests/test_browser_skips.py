"""Without Chromium the browser tests cannot pass silently: the summary says how many skipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_missing_chromium_is_reported_loudly(tmp_path: Path) -> None:
    env = {**os.environ, "CHROMIUM": str(tmp_path / "no-chromium")}
    argv = [sys.executable, "-m", "pytest", "tests/browser", "-q", "-p", "no:randomly"]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/browser", "-q", "--collect-only"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    counted = re.search(r"(\d+) tests? collected", collected.stdout)
    assert counted, collected.stdout
    total = int(counted.group(1))
    assert run.returncode == 0, run.stdout[-3000:]
    loud = re.search(r"!+ (\d+) BROWSER TESTS SKIPPED: (.*) !+", run.stdout)
    assert loud, run.stdout[-3000:]
    assert int(loud.group(1)) == total >= 5
    assert "no-chromium is not installed" in loud.group(2)


def test_make_test_installs_chromium_or_says_it_cannot(tmp_path: Path) -> None:
    """``make test`` reaches the browser step; with no apt-get it warns instead of failing."""
    make = shutil.which("make")
    assert make is not None
    plan = subprocess.run([make, "-n", "test"], cwd=ROOT, capture_output=True, text=True)
    assert "apt-get install -y -q chromium" in plan.stdout  # the test path, not only .ci/run
    no_apt = subprocess.run(
        [make, "--no-print-directory", "browser", f"CHROMIUM={tmp_path / 'none'}"],
        cwd=ROOT,
        env={"PATH": str(tmp_path)},  # no apt-get on this PATH
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_apt.returncode == 0, no_apt.stderr
    assert "apt-get is not available: browser tests will be SKIPPED" in no_apt.stdout
