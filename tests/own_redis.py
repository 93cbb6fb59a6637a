"""An embedded Redis server of a test's own, beside the shared one the settings name."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from utilities.embedded_redis import ensure_running


@contextlib.contextmanager
def own_embedded_redis(data_dir: Path) -> Iterator[str]:
    """Start an embedded server in ``data_dir`` (configured from the environment, as
    ``runstack``'s is), yield its URL and stop it at the end.

    ``ensure_running`` names its server in ``REDIS_URL``: the shared server stays
    named there.
    """
    saved = os.environ.get("REDIS_URL")
    try:
        url = ensure_running(data_dir)
    finally:
        if saved is None:
            os.environ.pop("REDIS_URL", None)
        else:
            os.environ["REDIS_URL"] = saved
    try:
        yield url
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((data_dir / "redis" / "pid").read_text()), signal.SIGTERM)
