"""FIFO: non-preemptive, strict head-of-line blocking, no backfill (the Tiresias simulator's fifo).

With priority classes there is one FIFO queue per class, served high before
normal before low; the head of the whole line (the first job of the highest
non-empty class) blocks everything behind it.  With fair share, each class's
queue is ordered by tenant key first, then arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Any

from scheduler.policies.base import Plan, Policy, PolicyCore, appended_in_order
from scheduler.priority import CLASSES
from scheduler.records import JobRecord


class FifoCore(PolicyCore):
    """Jobs start in class, then arrival order; the first one that does not fit blocks all behind it."""

    blocking = True

    def __init__(self, total_gpus: int) -> None:
        super().__init__(total_gpus)
        self.queues: list[deque[JobRecord]] = [deque() for _ in CLASSES]
        self.used = 0

    def add(self, job: JobRecord, now: float) -> None:
        """Join the tail of its class's queue (the class ageing gives it, if on)."""
        self.age_queued(job, now)
        self.queues[job.klass].append(job)

    def mark_running(self, job: JobRecord, now: float) -> None:
        """A job restored from a snapshot already holds its GPUs."""
        self.queues[job.klass].remove(job)
        self.used += job.alloc

    def remove(self, job: JobRecord, now: float) -> None:
        """Give back the finished job's GPUs (a queued job leaves its queue)."""
        if job.running:
            self.used -= job.alloc
        else:
            self.queues[job.klass].remove(job)

    def decide(self, now: float) -> Plan:
        """Start queued jobs from the head while each fits.

        A job held back at ``now`` (:meth:`held_back`: its tenant's quota keeps it out, in
        the simulator) is no candidate, as the tick's snapshot leaves it out: it neither
        starts nor blocks the line behind it.
        """
        if self._age_heap:
            self.apply_ageing(now)
        plan: Plan = []
        free = self.total - self.used
        skip = self.held_back(now) if self.refused else None
        for i, queue in enumerate(self.queues):
            if not queue:
                continue
            fs = self.fair_share
            if fs is not None and len(queue) > 1 and fs.active(j.tenant for j in queue):
                key = fs.key
                queue = self.queues[i] = deque(sorted(queue, key=lambda j: (key(j.tenant), j.idx)))
            if skip:
                free, blocked = self._start_around(queue, skip, free, plan)
                if blocked:
                    break
                continue
            while queue and queue[0].requested <= free:
                job = queue.popleft()
                free -= job.requested
                self.used += job.requested
                plan.append((job, job.requested))
            if queue:
                break  # head-of-line blocking across classes too
        return plan

    def _start_around(
        self, queue: deque[JobRecord], skip: set[JobRecord], free: int, plan: Plan
    ) -> tuple[int, bool]:
        """Start ``queue``'s jobs in order, passing over those in ``skip``, until one does
        not fit; the GPUs left free, and whether a job blocks the line (the rest waits)."""
        started: list[JobRecord] = []
        blocked = False
        for job in queue:
            if job in skip:
                continue
            if job.requested > free:
                blocked = True
                break
            free -= job.requested
            self.used += job.requested
            started.append(job)
            plan.append((job, job.requested))
        for job in started:
            queue.remove(job)
        return free, blocked

    def reclass(self, job: JobRecord, klass: int, now: float) -> None:
        """Move a queued job to its new class's queue, in arrival order there."""
        self.queues[job.klass].remove(job)
        job.klass = klass
        queue = self.queues[klass]
        at = len(queue)
        while at and queue[at - 1].idx > job.idx:
            at -= 1
        queue.insert(at, job)

    def unplaced(self, refused: Plan, now: float) -> None:
        """Refused starts go back to the head of their class's queue, in their order."""
        for job, _ in reversed(refused):
            self.queues[job.klass].appendleft(job)
            self.used -= job.requested

    def reorder(self, jobs: Collection[JobRecord]) -> None:
        """Each class queue that got a queued job back in arrival (``idx``) order."""
        added: dict[int, int] = {}
        for job in jobs:
            if not job.running:
                added[job.klass] = added.get(job.klass, 0) + 1
        for klass, count in added.items():
            if not appended_in_order(self.queues[klass], count):
                self.queues[klass] = deque(sorted(self.queues[klass], key=_arrival))

    def checkpoint(self) -> dict[str, Any]:
        """The books, each class queue copied too (a pass pops and re-sorts them)."""
        saved = super().checkpoint()
        saved["queues"] = [queue.copy() for queue in self.queues]
        return saved

    def waiting_count(self) -> int:
        """Jobs queued."""
        return sum(len(q) for q in self.queues)

    def pending_order(self, now: float) -> list[JobRecord]:
        """Class by class, each queue in fair-share then arrival order."""
        fs = self.fair_share
        out: list[JobRecord] = []
        for q in self.queues:
            if fs is not None and fs.active(j.tenant for j in q):
                key = fs.key
                out.extend(sorted(q, key=lambda j: (key(j.tenant), j.idx)))
            else:
                out.extend(q)
        return out


def _arrival(job: JobRecord) -> int:
    return job.idx


class FifoPolicy(Policy):
    """First in, first out (per priority class)."""

    name = "fifo"

    def new_core(self, total_gpus: int) -> FifoCore:
        """A fresh FIFO core."""
        return FifoCore(total_gpus)
