"""SRTF: oracle preemptive shortest-remaining-time first (a reference, not a deployable policy).

Follows the Tiresias simulator's ``shortest``: every pass stable-sorts all
runnable jobs by remaining time (seconds, not GPU-seconds, true durations;
ties keep the previous pass's order, arrivals join at the end), then a greedy
first fit starts or keeps each job that fits and preempts running ones that
do not.  Each pass is O(jobs log jobs): fine for reference runs, not for
whole production traces.

Priority classes come first (a high job with more remaining time is still
served before a normal one); with fair share, the tenant key comes next.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.policies.base import Plan, Policy, PolicyCore, appended_in_order
from scheduler.records import JobRecord


class SrtfCore(PolicyCore):
    """All runnable jobs in one list, re-sorted every pass."""

    def __init__(self, total_gpus: int) -> None:
        super().__init__(total_gpus)
        self.jobs: list[JobRecord] = []

    def add(self, job: JobRecord, now: float) -> None:
        """Arrivals join the end (they sort by remaining time at the next pass)."""
        self.age_queued(job, now)
        self.jobs.append(job)

    def remove(self, job: JobRecord, now: float) -> None:
        """Drop a finished job."""
        self.jobs.remove(job)

    def decide(self, now: float) -> Plan:
        """Sort by remaining time, first fit, preempt what no longer fits."""
        if self._age_heap:
            self.apply_ageing(now)
        for job in self.jobs:
            job.settle(now)
        fs = self.fair_share
        if fs is not None and fs.active(j.tenant for j in self.jobs):
            key = fs.key
            self.jobs.sort(key=lambda j: (j.klass, key(j.tenant), j.remaining))
        else:
            self.jobs.sort(key=_class_remaining)
        free = self.total
        plan: Plan = []
        starts: Plan = []
        skip = self.held_back(now) if self.refused else None
        for job in self.jobs:
            if skip and job in skip and not job.running:
                continue
            if job.requested <= free:
                free -= job.requested
                if not job.running:
                    starts.append((job, job.requested))
            elif job.running:
                plan.append((job, 0))
        if self.ageing is not None:
            for job, _ in plan:
                self.requeued(job, now)
        return plan + starts

    def unplaced(self, refused: Plan, now: float) -> None:
        """Nothing to undo: every pass decides again from the jobs' own state."""

    def reorder(self, jobs: Collection[JobRecord]) -> None:
        """The list back in arrival (``idx``) order, as a fresh restore makes it."""
        if not appended_in_order(self.jobs, len(jobs)):
            self.jobs.sort(key=_arrival)

    def waiting_count(self) -> int:
        """Jobs without GPUs."""
        return sum(1 for j in self.jobs if not j.running)

    def pending_order(self, now: float) -> list[JobRecord]:
        """Queued jobs by class, tenant key (with fair share) and remaining time."""
        for job in self.jobs:
            job.settle(now)
        fs = self.fair_share
        pending = [j for j in self.jobs if not j.running]
        if fs is not None and fs.active(j.tenant for j in pending):
            key = fs.key
            return sorted(pending, key=lambda j: (j.klass, key(j.tenant), j.remaining))
        return sorted(pending, key=_class_remaining)


def _arrival(job: JobRecord) -> int:
    return job.idx


def _class_remaining(job: JobRecord) -> tuple[int, float]:
    return (job.klass, job.remaining)


class SrtfPolicy(Policy):
    """Shortest remaining time first (needs true remaining work: an oracle)."""

    name = "srtf"

    def new_core(self, total_gpus: int) -> SrtfCore:
        """A fresh SRTF core."""
        return SrtfCore(total_gpus)
