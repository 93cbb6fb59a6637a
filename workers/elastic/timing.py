"""Step timing of one worker: when each committed mini-batch ended, read by the leader.

Times come from the worker's injected clock, so the leader's arithmetic
(``T_b`` for the switch step, samples/s for progress and profiles) is tested
with a manual clock.
"""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
from collections import deque
from typing import IO, Any


class StepTimes:
    """The end times of the recent committed mini-batches."""

    def __init__(self, maxlen: int = 200) -> None:
        self._ends: deque[tuple[int, float]] = deque(maxlen=maxlen)

    def mark(self, step: int, at: float) -> None:
        """Mini-batch ``step`` (the committed count) ended at ``at`` (monotonic seconds).

        A step marked again (a consistent recovery went back to a checkpoint and
        replays from there) ends the old timeline: the ends from that step on
        are dropped, so a rate measured from a replayed step counts the replay,
        not the seconds since the same step ended before the failure.
        """
        while self._ends and self._ends[-1][0] >= step:
            self._ends.pop()
        self._ends.append((step, at))

    def batch_time(self) -> float:
        """Median wall time of the last 10 consecutive mini-batches (``T_b``; 0 if none)."""
        ends = list(self._ends)
        gaps = [b[1] - a[1] for a, b in itertools.pairwise(ends) if b[0] == a[0] + 1]
        return statistics.median(gaps[-10:]) if gaps else 0.0

    def throughput_since(self, step: int) -> tuple[int, float]:
        """(mini-batches, seconds) between the end of ``step`` and the latest step end."""
        ends = list(self._ends)
        steps = [s for s, _ in ends]
        i = bisect.bisect_left(steps, step)
        if i >= len(ends) or ends[i][0] != step:
            return 0, 0.0
        return ends[-1][0] - step, ends[-1][1] - ends[i][1]


class StepLog:
    """One JSON line per committed mini-batch (``--step-log``; tests and benchmarks read it)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] | None = open(path, "a")  # noqa: SIM115 - closed by close()

    def write(self, **record: Any) -> None:
        """Append one record."""
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
