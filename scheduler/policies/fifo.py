"""FIFO: non-preemptive, strict head-of-line blocking, no backfill (the Tiresias simulator's fifo)."""

from __future__ import annotations

from collections import deque

from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.records import JobRecord


class FifoCore(PolicyCore):
    """Jobs start in arrival order; the first one that does not fit blocks all behind it."""

    blocking = True

    def __init__(self, total_gpus: int) -> None:
        super().__init__(total_gpus)
        self.queue: deque[JobRecord] = deque()
        self.used = 0

    def add(self, job: JobRecord, now: float) -> None:
        """Join the tail of the one queue."""
        self.queue.append(job)

    def mark_running(self, job: JobRecord, now: float) -> None:
        """A job restored from a snapshot already holds its GPUs."""
        self.queue.remove(job)
        self.used += job.alloc

    def remove(self, job: JobRecord, now: float) -> None:
        """Give back the finished job's GPUs."""
        self.used -= job.alloc

    def decide(self, now: float) -> Plan:
        """Start queued jobs from the head while each fits."""
        plan: Plan = []
        free = self.total - self.used
        queue = self.queue
        while queue and queue[0].requested <= free:
            job = queue.popleft()
            free -= job.requested
            self.used += job.requested
            plan.append((job, job.requested))
        return plan

    def unplaced(self, refused: Plan, now: float) -> None:
        """Refused starts go back to the head of the queue, in their order."""
        for job, _ in reversed(refused):
            self.queue.appendleft(job)
            self.used -= job.requested

    def waiting_count(self) -> int:
        """Jobs queued."""
        return len(self.queue)


class FifoPolicy(Policy):
    """First in, first out."""

    name = "fifo"

    def new_core(self, total_gpus: int) -> FifoCore:
        """A fresh FIFO core."""
        return FifoCore(total_gpus)
