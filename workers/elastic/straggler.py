"""Straggler detection: a worker slow in ``needed`` of its last ``window`` mini-batches.

A mini-batch is *slow* for a worker when its compute time exceeds ``ratio``
times its peers' typical time (the peers are the other workers, so that two
workers can be told apart too)::

    mini-batch        1   2   3   4   5   6   7   8   9  10
    w2 / peers       1.5 1.6 1.1 1.5 1.7 1.4 1.5 1.6 1.5 1.4    slow = above 1.2
    slow?             x   x   .   x   x   x   x   x   x   x     9 of the last 10: flagged

The peers' typical time is the median of all their compute times in the
window (``baseline="window"``), not of this one mini-batch: a peer
descheduled for one batch then neither hides a straggler nor makes a healthy
worker look slow, and one noisy batch of the worker itself is forgiven (9 of
10). EDL's rule is ``PAPER_RULE``: ten *consecutive* mini-batches above 1.2x
the median of the same mini-batch. On a shared machine one noisy mini-batch
breaks such a streak, so a worker slowed by half a mini-batch was flagged only
after 11-50 s (``workers/tests/test_straggler.py`` drives both rules with the
same seeded noise).

Pure: the leader feeds it the per-worker compute times that every worker puts
into the gradient all-reduce, so detection costs no extra message.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class StragglerRule:
    """When a worker counts as a straggler: slow in ``needed`` of its last ``window`` batches."""

    ratio: float = 1.2
    """A mini-batch is slow when the worker's time exceeds this times its peers' median."""
    window: int = 10
    """How many of the worker's latest mini-batches are looked at."""
    needed: int = 9
    """How many of those must be slow (``needed == window``: consecutive, as in EDL)."""
    min_excess_s: float = 0.01
    """And it must exceed the peers' time by this many seconds: in mini-batches of a few
    milliseconds (the leader's own duties, a warm-up) a ratio means nothing."""
    baseline: Literal["window", "batch"] = "window"
    """The peers' time a worker is compared with: the median of all their times in the
    window, or (EDL) the median of their times in the same mini-batch."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 1.0):
            raise ValueError(f"straggler ratio must be a finite number > 1, not {self.ratio!r}")
        if not 1 <= self.window <= 1000:
            raise ValueError(f"straggler window must be within [1, 1000], not {self.window!r}")
        if not 1 <= self.needed <= self.window:
            raise ValueError(
                f"straggler needed must be within [1, window={self.window}], not {self.needed!r}"
            )
        if not (math.isfinite(self.min_excess_s) and self.min_excess_s >= 0):
            raise ValueError(f"straggler min_excess_s must be >= 0, not {self.min_excess_s!r}")
        if self.baseline not in ("window", "batch"):
            raise ValueError(f"straggler baseline must be window or batch, not {self.baseline!r}")

    def spec(self) -> str:
        """The rule as ``parse_rule`` reads it (``9/10@1.2``, ``10/10@1.2/batch``)."""
        text = f"{self.needed}/{self.window}@{self.ratio:g}"
        return text if self.baseline == "window" else f"{text}/{self.baseline}"


DEFAULT_RULE = StragglerRule()
"""Noise-robust default: 9 of the last 10 mini-batches above 1.2x the peers' window median."""

PAPER_RULE = StragglerRule(ratio=1.2, window=10, needed=10, baseline="batch")
"""EDL's rule: 10 consecutive mini-batches above 1.2x the median."""

_NAMED = {"default": DEFAULT_RULE, "paper": PAPER_RULE}
_SPEC = re.compile(r"(\d{1,4})/(\d{1,4})@(\d{1,3}(?:\.\d{1,6})?)(/batch|/window)?")


def parse_rule(text: str) -> StragglerRule:
    """The rule ``text`` names: ``default``, ``paper`` or ``K/N@R[/batch|/window]``.

    ``K/N@R``: slow (above R times the peers' time) in K of the last N
    mini-batches; the peers' time is their window median unless ``/batch``.

    Raises ValueError with a message fit for a command line on anything else.
    """
    text = text.strip()
    if text in _NAMED:
        return _NAMED[text]
    match = _SPEC.fullmatch(text)
    if match is None:
        raise ValueError(
            f"straggler rule {text[:40]!r} is not 'default', 'paper' or K/N@RATIO (e.g. 9/10@1.2)"
        )
    needed, window, ratio, baseline = match.groups()
    return StragglerRule(
        ratio=float(ratio),
        window=int(window),
        needed=int(needed),
        baseline="batch" if baseline == "/batch" else "window",
    )


@dataclass
class StragglerDetector:
    """Keeps each worker's recent ratios to its peers and flags those the rule catches."""

    rule: StragglerRule = DEFAULT_RULE
    history: dict[str, deque[float]] = field(default_factory=dict)
    """Per worker, its ratio to its peers' time in each of its latest ``window`` batches."""
    times: dict[str, deque[float]] = field(default_factory=dict)
    """Per worker, its compute times in the latest ``window`` batches (the window baseline)."""

    def observe(self, times: dict[str, float]) -> list[tuple[str, float]]:
        """Feed one mini-batch's compute times; return ``(worker, ratio)`` newly flagged.

        ``ratio`` is the median of the worker's slow ratios in its window. A
        flagged worker's window starts afresh, so it is flagged again only on
        new evidence.
        """
        for gone in set(self.history) - set(times):
            del self.history[gone]
            self.times.pop(gone, None)
        if len(times) < 2:
            self.reset()
            return []
        for worker, seconds in times.items():
            self.times.setdefault(worker, deque(maxlen=self.rule.window)).append(seconds)
        flagged: list[tuple[str, float]] = []
        for worker, seconds in times.items():
            peers = self._peers_time(worker, times)
            ratios = self.history.setdefault(worker, deque(maxlen=self.rule.window))
            slow_enough = seconds - peers >= self.rule.min_excess_s
            ratios.append(seconds / peers if peers > 0 and slow_enough else 1.0)
            slow = [r for r in ratios if r > self.rule.ratio]
            if len(slow) >= self.rule.needed:
                flagged.append((worker, statistics.median(slow)))
                ratios.clear()
        return flagged

    def _peers_time(self, worker: str, times: dict[str, float]) -> float:
        if self.rule.baseline == "batch":
            return statistics.median(t for w, t in times.items() if w != worker)
        return statistics.median(t for w, ts in self.times.items() if w != worker for t in ts)

    def reset(self) -> None:
        """Forget all history (the membership changed: times are not comparable)."""
        self.history.clear()
        self.times.clear()
