"""Tiresias: discretized two-dimensional least-attained-service (2D-LAS) by GPU-time.

Paper (Gu et al., NSDI 2019): a job's priority is its attained service, GPUs x
executed time; jobs sit in a few queues cut at service thresholds; inside a
queue jobs are served FIFO; a starved job is promoted back to the top queue.

How a pass works here (the public Tiresias simulator's ``dlas-gpu``, which
decides the published numbers, see ``docs/scheduler.md``):

* New jobs join the tail of queue 0.  A running job whose attained service
  reaches its queue's threshold moves down one queue, to that queue's tail.
* A pass scans queue 0, 1, 2 ... in order with a non-blocking first fit by
  GPU count: a job that fits runs (or keeps running); one that does not is
  skipped, and preempted if it ran.
* After every pass each queue is stably re-ordered so its running jobs come
  before its pending ones: inside a queue a running job is never displaced by
  a job of the same queue, only by a higher queue.

Demotion timing: ``exact`` (default) demotes a job the moment it crosses its
threshold (one heap entry per running job).  ``compat=True`` reproduces the
public simulator: service is checked only at events, the extra check event is
``now + (threshold - executed_seconds) // gpus`` (its late formula), and a
job moves at most one queue per check.  Compat costs O(running jobs) per
event: use it for small traces.

Starvation promotion (our parameter ``starvation_factor``; off by default, as
in the published runs): a pending job below queue 0 that has waited at least
``factor x`` its executed seconds since it last ran goes back to queue 0 with
its attained service reset.

Priority classes (:mod:`scheduler.priority`) come strictly before the LAS
levels: with ``L`` levels a job sits in queue ``klass x L + level``, so every
high-class queue is scanned before any normal one.  Demotion stays inside the
class (a class's last level keeps its jobs) and starvation promotion returns a
job to its own class's level 0.  Because the pass lets a higher queue's pending
job take GPUs before a lower queue's running job, a higher class preempts a
lower one.  With fair share (``fair_share``), each queue's pending jobs are
considered by tenant key first (below share first), then in queue order.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from scheduler.fairshare import FairShare
from scheduler.policies.base import (
    Plan,
    Policy,
    PolicyCore,
    appended_in_order,
    fair_order,
    push_all,
)
from scheduler.priority import CLASSES, las_level
from scheduler.records import JobRecord

#: The Tiresias paper's defaults are not public as numbers in our sources; the
#: public simulator's code uses [3250, 7200] GPU-seconds and its README's
#: examples 3600.  We default to the simulator's code values.
DEFAULT_THRESHOLDS: tuple[float, ...] = (3250.0, 7200.0)

_EPS = 1e-6
_QUEUE_BOOKS = "queue books"  # a checkpoint's entry for the queues' contents


class _Queue:
    """One priority queue: running jobs in order, then pending, then demoted arrivals."""

    __slots__ = ("pending", "run_gpus", "running", "tail")

    def __init__(self) -> None:
        self.running: dict[JobRecord, None] = {}
        self.pending: list[JobRecord] = []
        self.tail: list[JobRecord] = []
        self.run_gpus = 0


class TiresiasCore(PolicyCore):
    """Incremental 2D-LAS state; see the module docstring for the rules."""

    def __init__(
        self,
        total_gpus: int,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        *,
        compat: bool = False,
        by_gpu_time: bool = True,
        starvation_factor: float | None = None,
    ) -> None:
        super().__init__(total_gpus)
        self.limits = tuple(float(x) for x in thresholds)
        self.levels = len(self.limits) + 1
        # queue index = class x levels + level: every class's levels, high class first
        self.queues = [_Queue() for _ in range(len(CLASSES) * self.levels)]
        # the queues of the classes seen so far, in order: a pass scans only these,
        # so a one-class trace costs what it did before classes existed
        self.active_queues: list[_Queue] = []
        self._classes_seen: set[int] = set()
        self.compat = compat
        self.by_gpu_time = by_gpu_time
        self.starvation_factor = starvation_factor
        self.waiting = 0
        self._stamp: dict[JobRecord, int] = {}
        self._demote_heap: list[tuple[float, int, JobRecord, int]] = []
        self._promote_heap: list[tuple[float, int, JobRecord, int]] = []
        self._seq = 0
        self._wake: float | None = None

    # -- membership -------------------------------------------------------
    def _see_class(self, klass: int) -> None:
        self._classes_seen.add(klass)
        L = self.levels
        self.active_queues = [
            q for c in sorted(self._classes_seen) for q in self.queues[c * L : (c + 1) * L]
        ]

    def add(self, job: JobRecord, now: float) -> None:
        """Arrivals join the tail of their class's level 0 (a snapshot's: the level its service says)."""
        self.age_queued(job, now)
        if job.klass not in self._classes_seen:
            self._see_class(job.klass)
        job.queue = job.klass * self.levels + (self.level_of(job) if job.attained > 0 else 0)
        job.base = self.start_size(job)
        self.queues[job.queue].pending.append(job)
        self.waiting += 1

    def restore_running(self, job: JobRecord, now: float) -> None:
        """Snapshot path: put a running job straight into the queue its class and service say."""
        self.restore_many((job,), now)

    def restore_many(self, jobs: Iterable[JobRecord], now: float) -> None:
        """:meth:`restore_running` for many jobs, in order; their crossings booked in one heapify.

        The same books as one call per job (the entries' sequence numbers
        included, so the heap pops in the same order), without a push per job.
        """
        seen, levels, queues = self._classes_seen, self.levels, self.queues
        entries: list[tuple[float, int, JobRecord, int]] = []
        for job in jobs:
            if job.klass not in seen:
                self._see_class(job.klass)
            job.queue = job.klass * levels + self.level_of(job)
            job.base = job.alloc or job.requested
            q = queues[job.queue]
            q.running[job] = None
            q.run_gpus += job.base
            entry = self._crossing(job, now)
            if entry is not None:
                entries.append(entry)
        push_all(self._demote_heap, entries)

    def remove(self, job: JobRecord, now: float) -> None:
        """A running job finished."""
        q = self.queues[job.queue]
        if job in q.running:
            del q.running[job]
            q.run_gpus -= job.base
        elif job in q.tail:
            q.tail.remove(job)
            q.run_gpus -= job.base
        else:  # a pending job cannot finish, but keep the books straight anyway
            q.pending.remove(job)
            self.waiting -= 1
        self._stamp.pop(job, None)

    def waiting_count(self) -> int:
        """Jobs queued without GPUs."""
        return self.waiting

    def pending_order(self, now: float) -> list[JobRecord]:
        """Queue by queue (class, then LAS level), each in fair-share then queue order."""
        return [job for q in self.active_queues for job in fair_order(q.pending, self.fair_share)]

    # -- kept cores (scheduler.policies.kept) ---------------------------------
    def reorder(self, jobs: Collection[JobRecord]) -> None:
        """The queues that got these jobs back in ``idx`` order (running and pending apart)."""
        running: dict[int, int] = {}
        pending: dict[int, int] = {}
        for job in jobs:
            books = running if job in self.queues[job.queue].running else pending
            books[job.queue] = books.get(job.queue, 0) + 1
        for i, added in running.items():
            q = self.queues[i]
            tail = list(itertools.islice(reversed(q.running), added + 1))[::-1]
            if not appended_in_order(tail, added):
                q.running = dict.fromkeys(sorted(q.running, key=_arrival))
        for i, added in pending.items():
            if not appended_in_order(self.queues[i].pending, added):
                self.queues[i].pending.sort(key=_arrival)

    def restored_books(self, *, removed: bool, rekey: Sequence[JobRecord] | None) -> None:
        """No threshold crossings booked: a fresh restore's never demote in its first pass.

        ``level_of`` files a restored job below the first threshold its service
        has not reached (with the same slack the demotion check uses), so the
        crossings a fresh pass finds due only book themselves again.
        """
        self._demote_heap.clear()

    def checkpoint(self) -> dict[str, Any]:
        """The books, with each queue's running, pending and demoted jobs copied."""
        saved = super().checkpoint()
        saved[_QUEUE_BOOKS] = [
            (q.running.copy(), q.pending.copy(), q.tail.copy(), q.run_gpus) for q in self.queues
        ]
        return saved

    def rollback(self, saved: dict[str, Any]) -> None:
        """The books and every queue as :meth:`checkpoint` copied them."""
        saved = dict(saved)
        books = saved.pop(_QUEUE_BOOKS)
        super().rollback(saved)
        for q, (running, pending, tail, run_gpus) in zip(self.queues, books, strict=True):
            q.running, q.pending, q.tail, q.run_gpus = running, pending, tail, run_gpus

    # -- service accounting -------------------------------------------------
    def service(self, job: JobRecord) -> float:
        """The quantity compared with the thresholds: GPU-seconds (or seconds for ``dlas``)."""
        if self.by_gpu_time:
            if self.compat:  # the simulator multiplies whole executed seconds by the GPU count
                return job.q_exec * job.requested
            return job.attained
        return job.q_exec

    def level_of(self, job: JobRecord) -> int:
        """The LAS level (inside its class) a job's service puts it in (an interactive job:
        always the top, ``scheduler.priority.las_level``)."""
        if job.interactive:
            return las_level(0, True)
        s = self.service(job)
        level = 0
        for limit in self.limits:
            if s + _EPS >= limit:
                level += 1
        return level

    def start_size(self, job: JobRecord) -> int:
        """GPUs a pending job asks for in a pass."""
        return job.requested

    def fit_size(self, job: JobRecord, free: int) -> int:
        """GPUs to start a pending job with when ``free`` are left (0: it does not fit)."""
        size = job.requested
        return size if size <= free else 0

    def _bump(self, job: JobRecord) -> int:
        stamp = self._stamp.get(job, 0) + 1
        self._stamp[job] = stamp
        return stamp

    def _started(self, job: JobRecord, now: float, gpus: int = 0) -> None:
        """Book the next threshold crossing of a job that runs from now on (on ``gpus``)."""
        entry = self._crossing(job, now, gpus)
        if entry is not None:
            heapq.heappush(self._demote_heap, entry)

    def _crossing(
        self, job: JobRecord, now: float, gpus: int = 0
    ) -> tuple[float, int, JobRecord, int] | None:
        """The demotion-heap entry of a job that runs from now on (None: no threshold ahead).

        Stamps the job: entries made before this one are void.
        """
        stamp = self._bump(job)
        level = job.queue % self.levels
        if self.compat or level >= len(self.limits) or job.interactive:
            return None
        limit = self.limits[level]
        if self.by_gpu_time:
            rate = float(gpus or job.alloc or job.base)
            when = now + max(0.0, limit - job.attained) / rate
        else:
            when = now + max(0.0, limit - job.q_exec)
        self._seq += 1
        return (when, self._seq, job, stamp)

    def _stopped(self, job: JobRecord, now: float) -> None:
        job.settle(now)
        stamp = self._bump(job)
        self.requeued(job, now)
        if self.starvation_factor is not None and job.queue % self.levels and job.q_exec > 0:
            when = now + self.starvation_factor * job.q_exec
            self._seq += 1
            heapq.heappush(self._promote_heap, (when, self._seq, job, stamp))

    def resized(self, job: JobRecord, now: float, gpus: int) -> None:
        """A running job's GPU count changes to ``gpus``: re-book its crossing (elastic)."""
        job.settle(now)
        self._started(job, now, gpus)

    def reclass(self, job: JobRecord, klass: int, now: float) -> None:
        """Move a queued job to the same LAS level of class ``klass``.

        An aged job joins the tail of its new queue's pending jobs; a stopped
        job going back down to its own class waits at the head of its queue,
        as every preempted job does.
        """
        if klass not in self._classes_seen:
            self._see_class(klass)
        self.queues[job.queue].pending.remove(job)
        up = klass < job.klass
        job.klass = klass
        job.queue = klass * self.levels + job.queue % self.levels
        pending = self.queues[job.queue].pending
        if up:
            pending.append(job)
        else:
            pending.insert(0, job)

    def unplaced(self, refused: Plan, now: float) -> None:
        """Refused starts leave the running set and wait at the head of their queue."""
        back: dict[int, list[JobRecord]] = {}
        for job, _ in refused:
            q = self.queues[job.queue]
            if job.running or job not in q.running:
                continue
            del q.running[job]
            q.run_gpus -= job.base
            back.setdefault(job.queue, []).append(job)
            self.waiting += 1
            self._bump(job)  # its booked threshold crossing is void
        for level, jobs in back.items():
            self.queues[level].pending[:0] = jobs
        if back:
            self._wake = self._next_check(now)  # the refused jobs' crossings are void

    # -- the pass -----------------------------------------------------------
    def _demote(self, job: JobRecord) -> None:
        q = self.queues[job.queue]
        del q.running[job]
        q.run_gpus -= job.base
        job.queue += 1
        nq = self.queues[job.queue]
        nq.tail.append(job)
        nq.run_gpus += job.base

    def _apply_demotions(self, now: float) -> None:
        last = len(self.limits)
        levels = self.levels
        if self.compat:
            due = []
            for i, q in enumerate(self.queues):
                if i % levels >= last:
                    continue
                for job in q.running:
                    job.settle(now)
                    if job.interactive:  # stays at its class's top level (las_level)
                        continue
                    if self.service(job) >= self.limits[job.queue % levels]:
                        due.append(job)
            due.sort(key=_arrival)
            for job in due:
                self._demote(job)
            return
        heap = self._demote_heap
        due = []
        while heap and heap[0][0] <= now + _EPS:
            _, _, job, stamp = heapq.heappop(heap)
            if self._stamp.get(job) != stamp or not job.running or job.queue % levels >= last:
                continue
            job.settle(now)
            due.append(job)
        due.sort(key=_arrival)
        for job in due:
            level = job.queue % levels
            if level < last and self.service(job) + _EPS >= self.limits[level]:
                self._demote(job)
            self._started(job, now)  # books the next threshold, if any

    def _apply_promotions(self, now: float) -> None:
        heap = self._promote_heap
        while heap and heap[0][0] <= now + _EPS:
            _, _, job, stamp = heapq.heappop(heap)
            if self._stamp.get(job) != stamp or job.running:
                continue
            q = self.queues[job.queue]
            q.pending.remove(job)
            job.queue = job.klass * self.levels
            job.attained = 0.0
            job.q_exec = 0.0
            self.queues[job.queue].pending.append(job)

    def decide(self, now: float) -> Plan:
        """Demote, promote, age, then one first-fit pass over the queues in priority order."""
        self._apply_demotions(now)
        if self._age_heap:
            self.apply_ageing(now)
        if self._promote_heap:
            self._apply_promotions(now)
        plan = self._pass(now)
        self._wake = self._next_check(now)
        return plan

    def _pass(self, now: float) -> Plan:
        free = self.total
        skip = self.held_back(now) if self.refused else None
        preempts: Plan = []
        starts: Plan = []
        fs = self.fair_share
        for q in self.active_queues:
            # 1. running jobs of this queue, in order
            if q.run_gpus - _tail_gpus(q) <= free:
                free -= q.run_gpus - _tail_gpus(q)
                lost_running: list[JobRecord] = []
            else:
                lost_running = []
                for job in q.running:
                    if job.base <= free:
                        free -= job.base
                    else:
                        lost_running.append(job)
            # 2. pending jobs of this queue, first fit
            started: list[JobRecord] = []
            if q.pending and free > 0 and fs is not None and fs.active(j.tenant for j in q.pending):
                free = self._fair_first_fit(q, free, skip, fs, started)
            elif q.pending and free > 0:
                kept: list[JobRecord] = []
                pending = q.pending
                i = 0
                n = len(pending)
                while i < n and free > 0:
                    job = pending[i]
                    size = self.fit_size(job, free) if not (skip and job in skip) else 0
                    if size:
                        free -= size
                        job.base = size
                        started.append(job)
                    else:
                        kept.append(job)
                    i += 1
                if started:
                    q.pending = kept + pending[i:] if i < n else kept
            # 3. demoted jobs at the tail
            lost_tail: list[JobRecord] = []
            for job in q.tail:
                if job.base <= free:
                    free -= job.base
                else:
                    lost_tail.append(job)
            # re-order: running (kept), started, tail (kept); pending: lost, rest, lost tail
            for job in lost_running:
                del q.running[job]
                q.run_gpus -= job.base
                preempts.append((job, 0))
            for job in started:
                q.running[job] = None
                q.run_gpus += job.base
                starts.append((job, job.base))
            for job in q.tail:
                if job in lost_tail:
                    q.run_gpus -= job.base
                    preempts.append((job, 0))
                else:
                    q.running[job] = None
            q.tail = []
            if lost_running or lost_tail:
                q.pending = lost_running + q.pending + lost_tail
            self.waiting += len(lost_running) + len(lost_tail) - len(started)
        for job, _ in preempts:
            self._stopped(job, now)
        for job, n in starts:
            self._started(job, now, n)
        return preempts + starts

    def _fair_first_fit(
        self,
        q: _Queue,
        free: int,
        skip: set[JobRecord] | None,
        fs: FairShare,
        started: list[JobRecord],
    ) -> int:
        """First fit over ``q``'s pending jobs with fair share on: tenants below their share
        first, queue order among equals.  The jobs started join ``started`` and leave the
        queue; returns the GPUs left."""
        for job in fair_order(q.pending, fs):
            if free <= 0:
                break
            size = self.fit_size(job, free) if not (skip and job in skip) else 0
            if size:
                free -= size
                job.base = size
                started.append(job)
        if started:
            gone = set(started)
            q.pending = [j for j in q.pending if j not in gone]
        return free

    def _next_check(self, now: float) -> float | None:
        last = len(self.limits)
        if self.compat:
            best: float | None = None
            for i, q in enumerate(self.queues):
                if i % self.levels >= last:
                    continue
                for job in q.running:
                    # the simulator's formula: (threshold - executed seconds) // GPUs
                    step: float = self.limits[job.queue % self.levels] - job.q_exec
                    if self.by_gpu_time:
                        step = math.floor(step / job.requested)
                    when = now + step
                    if best is None or when < best:
                        best = when
            return best
        nxt: float | None = None
        heap = self._demote_heap
        while heap and self._stamp.get(heap[0][2]) != heap[0][3]:
            heapq.heappop(heap)
        if heap:
            nxt = heap[0][0]
        pheap = self._promote_heap
        while pheap and self._stamp.get(pheap[0][2]) != pheap[0][3]:
            heapq.heappop(pheap)
        if pheap and (nxt is None or pheap[0][0] < nxt):
            nxt = pheap[0][0]
        return nxt

    def next_wakeup(self) -> float | None:
        """The next demotion (or promotion) check."""
        return self._wake


def _tail_gpus(q: _Queue) -> int:
    return sum(job.base for job in q.tail) if q.tail else 0


def _arrival(job: JobRecord) -> int:
    return job.idx


class TiresiasPolicy(Policy):
    """Discretized 2D-LAS (``dlas-gpu``); ``by_gpu_time=False`` gives ``dlas`` (by time)."""

    name = "tiresias"

    def __init__(
        self,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        *,
        compat: bool = False,
        by_gpu_time: bool = True,
        starvation_factor: float | None = None,
    ) -> None:
        if any(b <= a for a, b in itertools.pairwise(thresholds)) or any(
            t <= 0 for t in thresholds
        ):
            raise ValueError("queue thresholds must be positive and increasing")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.compat = compat
        self.by_gpu_time = by_gpu_time
        self.starvation_factor = starvation_factor
        if not by_gpu_time:
            self.name = "dlas"

    def new_core(self, total_gpus: int) -> TiresiasCore:
        """A fresh 2D-LAS core."""
        return TiresiasCore(
            total_gpus,
            self.thresholds,
            compat=self.compat,
            by_gpu_time=self.by_gpu_time,
            starvation_factor=self.starvation_factor,
        )
