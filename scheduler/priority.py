"""Priority classes: the 0-100 job priority cut into three classes every policy orders by first.

A job's ``priority`` (0 lowest, 100 highest, 50 by default) falls in one of three
classes; a policy serves every pending job of a higher class before any of a
lower one, and a higher class may take GPUs from a lower class's running job
(Tiresias' pass preempts it; Elastic-Tiresias reclaims lower classes' extras
first)::

    priority   0 ........ 29 | 30 ........ 69 | 70 ........ 100
    class      LOW (2)       | NORMAL (1)     | HIGH (0)

Class numbers grow downwards so that sorting by class puts HIGH first.

Interactive sessions (``JobView.interactive``: a person at the keyboard): batch work of the
same or a lower class never preempts one, a higher class still may (:func:`may_preempt`).
The LAS policies keep a session at the top level of its class (:func:`las_level`): its
attained service never demotes it, and inside its queue a running job is never displaced
by a pending one, so only a higher class's queues come before it.

Ageing (as Slurm's age factor): strict classes starve the low class on a
loaded cluster, so a queued job that has waited ``class_ageing_s`` since it
last ran (or since it was submitted) counts one class higher, at most up to
NORMAL (:data:`AGED_CEILING`): HIGH stays reserved for jobs that ask for it.
An aged job keeps its aged class while it runs (so the class it joined does
not preempt it at once); stopped and queued again, it is back in its own class
and its wait starts over.  Ageing is off (None) unless a caller turns it on;
:data:`CLASS_AGEING_S` is the recommended value.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from scheduler.named_numbers import named_numbers

#: Class numbers, in service order.
HIGH = 0
NORMAL = 1
LOW = 2
CLASSES: tuple[int, ...] = (HIGH, NORMAL, LOW)
CLASS_NAMES: dict[int, str] = {HIGH: "high", NORMAL: "normal", LOW: "low"}

#: Priorities at or above this are HIGH; below ``LOW_BELOW`` they are LOW.
HIGH_FROM = 70
LOW_BELOW = 30

#: The highest class ageing can lift a job to.
AGED_CEILING = NORMAL

#: Recommended ageing period, seconds (see docs/results.md §9 for the sweep).
CLASS_AGEING_S: float = 24 * 3600.0

#: The priority a trace replay gives each class when it assigns them.
CLASS_PRIORITY: dict[str, int] = {"high": 90, "normal": 50, "low": 10}


def priority_class(priority: int) -> int:
    """The class of a 0-100 priority: 0 high (>= 70), 1 normal, 2 low (< 30)."""
    if priority >= HIGH_FROM:
        return HIGH
    if priority < LOW_BELOW:
        return LOW
    return NORMAL


def may_preempt(taker_class: int, victim_class: int, victim_interactive: bool) -> bool:
    """Whether a job of ``taker_class`` may take GPUs from a running job of ``victim_class``.

    An interactive victim only yields to a strictly higher class (a smaller number); for a
    batch victim the policy's own order decides (True here).
    """
    return not victim_interactive or taker_class < victim_class


def las_level(level: int, interactive: bool) -> int:
    """The LAS level a job sits at inside its class: the one its service earns, except an
    interactive job's, which stays at the top (0) however long it runs."""
    return 0 if interactive else level


def aged_class(klass: int, waited: float, ageing: float | None) -> int:
    """The class a job of class ``klass`` counts as after waiting ``waited`` seconds.

    One class higher per full ``ageing`` period waited, never above
    :data:`AGED_CEILING`; a class already at or above the ceiling never moves;
    ``ageing`` None turns ageing off.
    """
    if ageing is None or klass <= AGED_CEILING or waited < ageing:
        return klass
    return max(AGED_CEILING, klass - int(waited // ageing))


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_ageing(text: str) -> float | None:
    """``"off"`` or ``"0"`` -> None; ``"86400"``, ``"90m"``, ``"12h"``, ``"1.5d"`` -> seconds.

    Raises ValueError (one line) for anything else, negative or not finite.
    """
    t = text.strip().lower()
    if t in ("off", "none", "0"):
        return None
    scale = _UNITS.get(t[-1:], 0.0)
    number = t[:-1] if scale else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"bad class ageing {text!r} (use seconds, 30m, 12h, 1d or off)") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"class ageing {text!r} must be positive (or off)")
    return value


def parse_shares(text: str) -> dict[str, float]:
    """``"high=0.1,low=0.3"`` -> shares per class name; the rest is normal.

    Raises ValueError (one line) for unknown class names, non-numbers, negative
    shares or shares summing above 1.
    """
    shares: dict[str, float] = {}
    pairs = named_numbers(text, "priority share", "high=0.1,low=0.3", names=CLASS_PRIORITY)
    for part, name, share in pairs:
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
