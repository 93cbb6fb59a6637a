"""Straggler detection: a worker whose mini-batch compute time exceeds ``ratio`` times
the median of its peers' for ``patience`` consecutive mini-batches (EDL: 1.2 and 10).

Pure: the leader feeds it the per-worker compute times that every worker puts
into the gradient all-reduce, so detection costs no extra message.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class StragglerDetector:
    """Counts consecutive slow mini-batches per worker."""

    ratio: float = 1.2
    patience: int = 10
    streak: dict[str, int] = field(default_factory=dict)

    def observe(self, times: dict[str, float]) -> list[tuple[str, float]]:
        """Feed one mini-batch's compute times; return ``(worker, ratio)`` newly flagged."""
        if len(times) < 2:
            self.streak.clear()
            return []
        median = statistics.median(times.values())
        flagged: list[tuple[str, float]] = []
        for worker, seconds in times.items():
            if median > 0 and seconds > self.ratio * median:
                self.streak[worker] = self.streak.get(worker, 0) + 1
                if self.streak[worker] == self.patience:
                    flagged.append((worker, seconds / median))
            else:
                self.streak[worker] = 0
        for gone in set(self.streak) - set(times):
            del self.streak[gone]
        return flagged

    def reset(self) -> None:
        self.streak.clear()
