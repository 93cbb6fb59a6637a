"""Settings start nothing: loading them names the embedded Redis without running it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from utilities.embedded_redis import answers_ping

ROOT = Path(__file__).resolve().parents[2]


def test_loading_settings_starts_no_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(PORTAL_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings.dev")
    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.REDIS_URL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    port = int((tmp_path / "redis" / "port").read_text())
    assert out.stdout.strip() == f"redis://127.0.0.1:{port}/0"  # the recorded port
    assert not (tmp_path / "redis" / "pid").exists()
    assert not answers_ping(port)
