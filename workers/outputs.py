"""What a job may produce, as pure rules: paths inside its store prefix, metric names and values.

Shared by the runtime (which writes), the agent (which forwards) and the
control plane (which records), so a name one side accepts the others accept.
A job's objects live under its prefix (``workers.artifacts.job_prefix``) in
three folders; a path a report names is always relative to that prefix, so a
job can never point at another job's or tenant's objects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath

JOB_FOLDERS: tuple[str, ...] = ("checkpoints", "artifacts", "logs")
"""The folders under a job's prefix that reports may name."""

METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
MAX_METRIC_NAMES = 32
"""The most metric names in one logged point."""

MAX_METRIC_POINTS = 200
"""The most points one metrics event or report carries."""

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_PATH_CHARS = 512


class OutputError(ValueError):
    """A path or a metric a job produced that the rules refuse; the message names it."""


def check_job_path(path: str, what: str = "path", folder: str | None = None) -> str:
    """``path`` if it is a clean relative path under one of ``JOB_FOLDERS`` (or ``folder``)."""
    pure = PurePosixPath(path)
    if (
        not path
        or len(path) > MAX_PATH_CHARS
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise OutputError(f"{what} must be a relative path without '..', not {path!r}")
    folders = JOB_FOLDERS if folder is None else (folder,)
    if len(pure.parts) < 2 or pure.parts[0] not in folders:
        raise OutputError(f"{what} must lie in one of {', '.join(folders)}, not {path!r}")
    return path


def check_sha256(value: str, what: str = "sha256") -> str:
    """``value`` if it is a lower-case hex SHA-256 digest."""
    if not SHA256_HEX.match(value):
        raise OutputError(f"{what} must be 64 lower-case hex digits")
    return value


def check_metric_values(values: Mapping[str, object], what: str = "values") -> dict[str, float]:
    """The metrics of one point as ``{name: float}``: 1-32 valid names, finite numbers."""
    if not values:
        raise OutputError(f"{what} must name at least one metric")
    if len(values) > MAX_METRIC_NAMES:
        raise OutputError(f"{what} may name at most {MAX_METRIC_NAMES} metrics, not {len(values)}")
    checked: dict[str, float] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not METRIC_NAME.match(name):
            raise OutputError(
                f"{what}: metric name {name!r} must be a letter or '_' then up to 63 of "
                "letters, digits, '_', '.', '/', '-'"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OutputError(f"{what}.{name} must be a number")
        if not math.isfinite(value):
            raise OutputError(f"{what}.{name} must be finite")
        checked[name] = float(value)
    return checked
