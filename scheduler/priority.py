"""Priority classes: the 0-100 job priority cut into three classes every policy orders by first.

A job's ``priority`` (0 lowest, 100 highest, 50 by default) falls in one of three
classes; a policy serves every pending job of a higher class before any of a
lower one, and a higher class may take GPUs from a lower class's running job
(Tiresias' pass preempts it; Elastic-Tiresias reclaims lower classes' extras
first)::

    priority   0 ........ 29 | 30 ........ 69 | 70 ........ 100
    class      LOW (2)       | NORMAL (1)     | HIGH (0)

Class numbers grow downwards so that sorting by class puts HIGH first.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

#: Class numbers, in service order.
HIGH = 0
NORMAL = 1
LOW = 2
CLASSES: tuple[int, ...] = (HIGH, NORMAL, LOW)
CLASS_NAMES: dict[int, str] = {HIGH: "high", NORMAL: "normal", LOW: "low"}

#: Priorities at or above this are HIGH; below ``LOW_BELOW`` they are LOW.
HIGH_FROM = 70
LOW_BELOW = 30

#: The priority a trace replay gives each class when it assigns them.
CLASS_PRIORITY: dict[str, int] = {"high": 90, "normal": 50, "low": 10}


def priority_class(priority: int) -> int:
    """The class of a 0-100 priority: 0 high (>= 70), 1 normal, 2 low (< 30)."""
    if priority >= HIGH_FROM:
        return HIGH
    if priority < LOW_BELOW:
        return LOW
    return NORMAL


def parse_shares(text: str) -> dict[str, float]:
    """``"high=0.1,low=0.3"`` -> shares per class name; the rest is normal.

    Raises ValueError (one line) for unknown class names, non-numbers, negative
    shares or shares summing above 1.
    """
    shares: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in CLASS_PRIORITY:
            raise ValueError(f"bad priority share {part!r} (use e.g. high=0.1,low=0.3)")
        try:
            share = float(value)
        except ValueError:
            raise ValueError(f"bad priority share {part!r}: not a number") from None
        if not 0 <= share <= 1:
            raise ValueError(f"priority share {part!r} must be in [0, 1]")
        shares[name] = share
    if sum(shares.values()) > 1 + 1e-9:
        raise ValueError("priority shares add up to more than 1")
    return shares


def assign_priorities(count: int, shares: Mapping[str, float], seed: int) -> list[int]:
    """``count`` priorities drawn with these class shares (the rest normal), seeded."""
    rng = random.Random(seed)
    high = shares.get("high", 0.0)
    low = shares.get("low", 0.0)
    normal = shares.get("normal", max(0.0, 1.0 - high - low))
    names: Sequence[str] = ("high", "normal", "low")
    weights = (high, normal, low)
    if sum(weights) <= 0:
        return [CLASS_PRIORITY["normal"]] * count
    return [CLASS_PRIORITY[n] for n in rng.choices(names, weights=weights, k=count)]
