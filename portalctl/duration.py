"""Durations on the command line: ``3600``, ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` <-> seconds.

``--max-runtime`` takes one (the API's ``max_runtime_s`` is whole seconds);
``show`` and ``ls`` print a limit back in the same short form.
"""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([dhms])")


def parse_duration(text: str) -> int:
    """Whole seconds of ``"7200"``, ``"2h"``, ``"1h30m"``, ``"45s"``; ValueError (one line) else.

    A bare number is seconds; units are d, h, m, s, largest first, each at most
    once; the total must be at least one second.
    """
    t = text.strip().lower()
    if t.isdigit():
        seconds = int(t)
    else:
        parts = _PART.findall(t)
        units = [unit for _, unit in parts]
        ordered = sorted(units, key=lambda u: -_UNITS[u])
        if not parts or "".join(n + u for n, u in parts) != t or units != ordered:
            raise ValueError(f"not a duration: {text!r} (use seconds, or e.g. 30m, 2h, 1h30m, 1d)")
        if len(set(units)) != len(units):
            raise ValueError(f"not a duration: {text!r} (each unit at most once)")
        seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds < 1:
        raise ValueError(f"a duration must be at least one second, not {text!r}")
    return seconds


def format_duration(seconds: int | float | None) -> str:
    """``7200`` -> ``"2h"``, ``5400`` -> ``"1h30m"``, ``None`` -> ``""`` (no limit)."""
    if seconds is None:
        return ""
    left = int(seconds)
    if left <= 0:
        return "0s"
    out = []
    for unit, size in _UNITS.items():
        if left >= size:
            out.append(f"{left // size}{unit}")
            left %= size
    return "".join(out)
