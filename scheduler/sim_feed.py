"""Jobs that join a simulated run when the run says so: a sweep that promotes or stops trials.

A trace fixes every job and its submit time before the run starts.  A sweep
does not: which trial runs on, and when, depends on when the others end and
what they scored.  A :class:`Feed` is that decision, outside the event loop::

    Simulation(trace, policy, cfg, feed=feed)
      ├─ a job's last step is done (its completion)
      │    feed.ended(job id, now) -> [FedJob, ...]     the feed decides
      │    each FedJob: a record, submitted at now, with its weight
      └─ arrivals at now: the fed jobs join the core, the pass sees them

A job that "stops at a rung" is a job whose work is the rung's steps: it ends
there, and the feed either feeds its next rung (a new job, resumed from the
checkpoint the ended one left) or feeds nothing for it.  The trace's own jobs
weigh 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler.traces import TraceJob


@dataclass(frozen=True, slots=True)
class FedJob:
    """A job a feed adds to a run: the trace job (submitted when fed) and its scheduling weight."""

    job: TraceJob
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.weight < float("inf"):
            raise ValueError(f"fed job {self.job.id}: weight must be finite and > 0")


class Feed(Protocol):
    """What decides, as a run goes, which jobs join it."""

    def ended(self, job: str, now: float) -> Sequence[FedJob]:
        """Job ``job`` finished its work at ``now``: the jobs that join the run now."""
        ...
