"""Small typed readers for settings that come from the environment."""

from __future__ import annotations

import os


def env_str(name: str, default: str = "") -> str:
    """Return the variable, or ``default`` when it is unset or empty."""
    return os.environ.get(name) or default


def env_bool(name: str, default: bool) -> bool:
    """Read 1/0, true/false, yes/no, on/off (any case)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be a boolean (1/0, true/false), not {raw!r}")


def env_int(name: str, default: int) -> int:
    """Read an integer, with a clear error for anything else."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {raw!r}") from None


def env_float(name: str, default: float) -> float:
    """Read a float, with a clear error for anything else."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]
