"""What every policy provides, and the one adapter from snapshots to policy cores.

A policy has two faces over the same deciding code:

* ``schedule(snapshot) -> list[Decision]``: pure, for the control plane's tick.
  It rebuilds a fresh :class:`PolicyCore` from the snapshot, lets it decide
  once, and turns the size changes into GPU tuples with a placement.
* ``new_core(total_gpus)``: a long-lived core the simulator feeds with
  arrivals and completions, so a pass costs what changed, not the whole trace.
* ``queue_order(snapshot) -> list[str]``: the queued jobs in the order this
  policy would start them (the queue position users see).

Every core orders by priority class first (:mod:`scheduler.priority`) and,
when it has a :class:`~scheduler.fairshare.FairShare`, by tenant key inside
each of its queues (:func:`fair_order`).

Class ageing lives here once for every core: ``add`` calls :meth:`PolicyCore.age_queued`
(the job's class from its wait, and when it ages next), ``decide`` calls
:meth:`PolicyCore.apply_ageing` (due jobs move up through the core's
:meth:`PolicyCore.reclass`), a preemption calls :meth:`PolicyCore.requeued`
(own class again, the wait starts over).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any, TypeVar

from scheduler.curves import SpeedTables, view_speeds
from scheduler.fairshare import FairShare
from scheduler.gpu_types import split_by_type
from scheduler.placement import ConsolidatedPlacement, Placement, SelectorPlacement
from scheduler.priority import AGED_CEILING, aged_class, priority_class
from scheduler.records import JobRecord
from scheduler.types import (
    Cluster,
    Decision,
    Gpu,
    GpuState,
    JobView,
    Migrate,
    Preempt,
    Scale,
    Snapshot,
    Start,
)

#: Slack when comparing ageing times (seconds), so a wake-up at a job's due time ages it.
_AGE_EPS = 1e-6

#: A core's answer: (job, new GPU count); 0 preempts, a positive count starts or resizes.
Plan = list[tuple[JobRecord, int]]


class PolicyCore(ABC):
    """Incremental scheduling state over :class:`JobRecord` objects."""

    #: True for a strictly ordered queue (FIFO): when placement refuses a start,
    #: the starts behind it in the same pass are refused too (head-of-line blocking).
    blocking = False

    def __init__(self, total_gpus: int) -> None:
        self.total = total_gpus
        # Jobs whose start placement refused at ``refused_at``: a second pass at the
        # same time goes around them (see ``held_back``).
        self.refused: set[JobRecord] = set()
        self.refused_at = -1.0
        # Tenant fair share (None: off); the simulator advances its usage before each pass.
        self.fair_share: FairShare | None = None
        # Class ageing period in seconds (None: off) and the queued jobs' next ageing times.
        self.ageing: float | None = None
        self._age_heap: list[tuple[float, int, JobRecord]] = []
        self._age_seq = 0

    # -- class ageing ---------------------------------------------------------
    def age_queued(self, job: JobRecord, now: float) -> None:
        """Give a job joining the queue the class its wait since ``pending_since`` earns.

        Call before the core files the job by class.  A running job (snapshot
        path) keeps the class it was given; a queued one that can still move up
        is booked for :meth:`apply_ageing`.
        """
        ageing = self.ageing
        if ageing is None or job.running or job.own_klass <= AGED_CEILING:
            return
        job.klass = aged_class(job.own_klass, now - job.pending_since, ageing)
        self._book_ageing(job)

    def requeued(self, job: JobRecord, now: float) -> None:
        """A running job was stopped and waits again: its own class, its wait from ``now``.

        Call after the core has filed the job as queued; a job whose class
        changes is moved with :meth:`reclass`.
        """
        job.pending_since = now
        if self.ageing is None or job.own_klass <= AGED_CEILING:
            return
        if job.klass != job.own_klass:
            self.reclass(job, job.own_klass, now)
        self._book_ageing(job)

    def apply_ageing(self, now: float) -> None:
        """Lift every queued job whose ageing time has come (call at the start of a pass)."""
        ageing = self.ageing
        heap = self._age_heap
        if ageing is None:
            return
        while heap and heap[0][0] <= now + _AGE_EPS:
            due, _, job = heapq.heappop(heap)
            if not self._ageing_valid(due, job):
                continue  # it started, ended, or waits again since a later time
            self.reclass(
                job, aged_class(job.own_klass, due + _AGE_EPS - job.pending_since, ageing), now
            )
            self._book_ageing(job)

    def next_ageing(self) -> float | None:
        """When a queued job next moves up a class (None: no job will)."""
        heap = self._age_heap
        while heap and not self._ageing_valid(heap[0][0], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _due(self, job: JobRecord) -> float | None:
        """When a queued job's class next moves up (None: at the ceiling, or ageing off)."""
        if self.ageing is None or job.klass <= AGED_CEILING:
            return None
        return job.pending_since + self.ageing * (job.own_klass - job.klass + 1)

    def _book_ageing(self, job: JobRecord) -> None:
        due = self._due(job)
        if due is not None:
            self._age_seq += 1
            heapq.heappush(self._age_heap, (due, self._age_seq, job))

    def _ageing_valid(self, due: float, job: JobRecord) -> bool:
        """An entry still stands: the job waits, and its wait still ends at ``due``."""
        if job.running or job.end_time is not None:
            return False
        current = self._due(job)
        return current is not None and abs(current - due) <= _AGE_EPS

    def reclass(self, job: JobRecord, klass: int, now: float) -> None:
        """Move a queued job to class ``klass``; cores that file jobs by class override this."""
        job.klass = klass

    @abstractmethod
    def add(self, job: JobRecord, now: float) -> None:
        """A job arrives (queued, no GPUs)."""

    @abstractmethod
    def remove(self, job: JobRecord, now: float) -> None:
        """A job finished; its GPUs are free again."""

    @abstractmethod
    def decide(self, now: float) -> Plan:
        """One scheduling pass: the allocation changes to make now."""

    def restore_running(self, job: JobRecord, now: float) -> None:
        """Register a job that already runs (snapshot path); default: add then mark running."""
        self.add(job, now)
        self.mark_running(job, now)

    def restore_many(self, jobs: Iterable[JobRecord], now: float) -> None:
        """:meth:`restore_running` for each job, in order (cores may do it in bulk)."""
        for job in jobs:
            self.restore_running(job, now)

    def mark_running(self, job: JobRecord, now: float) -> None:  # noqa: B027 - optional hook
        """Hook for cores that keep running/pending sets apart."""

    def unplaced(self, refused: Plan, now: float) -> None:
        """Placement refused these changes of the last pass (in plan order); undo them.

        Each job keeps what it had before the pass: a refused start stays
        queued, a refused resize keeps its GPUs.  Placement by count never
        refuses, so only fabric-aware placements call this.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot run with a refusing placement")

    def note_refused(self, refused: Plan, now: float) -> None:
        """Remember the queued jobs refused at ``now`` so another pass then goes around them."""
        if self.refused_at != now:
            self.refused = set()
            self.refused_at = now
        self.refused.update(job for job, _ in refused if not job.running)

    def held_back(self, now: float) -> set[JobRecord]:
        """Queued jobs a pass at ``now`` must not start (placement refused them at ``now``)."""
        return self.refused if self.refused_at == now else set()

    def next_wakeup(self) -> float | None:
        """The next time this core wants a pass with no other event (None: never)."""
        return None

    def waiting_count(self) -> int:
        """Jobs queued now (for time series)."""
        return 0

    @abstractmethod
    def pending_order(self, now: float) -> list[JobRecord]:
        """The queued jobs in the order a pass at ``now`` would consider them for a start."""

    # -- kept cores (scheduler.policies.kept) -----------------------------------
    # A kept core is a restored core brought from one snapshot to the next by
    # ``remove`` and ``restore_many``/``add`` of the jobs that changed; these hooks
    # make what those leave behind equal to what a fresh restore holds.

    def reorder(self, jobs: Collection[JobRecord]) -> None:
        """Put the containers holding ``jobs`` (just restored or added) back in ``idx`` order.

        A fresh restore meets the jobs in ``idx`` order, so each of its queues is
        in that order; a kept core's inserts append.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot be kept between passes")

    def restored_books(self, *, removed: bool, rekey: Sequence[JobRecord] | None) -> None:  # noqa: B027
        """After a kept core's removals and inserts: the books beyond the queues as a fresh
        restore has them.  ``removed``: running jobs were removed (their entries go);
        ``rekey``: every running job, when the fair share or the jobs' idx changed."""

    def take_due_ageing(self, now: float) -> list[JobRecord]:
        """The queued jobs whose next class is due by ``now``, their entries taken off.

        A kept core adds these again: a fresh one would have added them in that class.
        """
        heap = self._age_heap
        due: dict[JobRecord, None] = {}
        while heap and heap[0][0] <= now:
            when, _, job = heapq.heappop(heap)
            if self._ageing_valid(when, job):
                due[job] = None
        return list(due)

    def checkpoint(self) -> dict[str, Any]:
        """Copies of this core's books, for :meth:`rollback` (a kept core decides, then undoes).

        Every container attribute is copied one level deep; cores whose
        containers hold containers the pass changes copy those too.
        """
        return {
            name: value.copy() if isinstance(value, list | dict | set | deque) else value
            for name, value in vars(self).items()
        }

    def rollback(self, saved: dict[str, Any]) -> None:
        """The books as :meth:`checkpoint` copied them (the records are the caller's)."""
        books = vars(self)
        books.clear()
        books.update(saved)


class Policy(ABC):
    """A named scheduling policy."""

    name: str = ""
    #: Seconds a queued job waits before it counts one class higher (None: no ageing);
    #: see :mod:`scheduler.priority` and its ``CLASS_AGEING_S``.
    class_ageing_s: float | None = None

    @abstractmethod
    def new_core(self, total_gpus: int) -> PolicyCore:
        """A fresh incremental core for a cluster of this many GPUs."""

    def schedule(
        self,
        snapshot: Snapshot,
        placement: Placement | None = None,
        *,
        speeds: SpeedTables | None = None,
    ) -> list[Decision]:
        """Decide on a snapshot; pure (nothing outside the call changes but ``speeds``' memo).

        Jobs are fed to the core running first, then by ``queue_since`` (or
        submit time) and id, so ties break the same way every time.  ``speeds``
        remembers the jobs' speed tables between passes (the same decisions,
        made faster when the curves are the same objects as in earlier passes).
        """
        placer = placement or ConsolidatedPlacement()
        split = split_by_type(snapshot)
        if split is None:  # one type, nobody asks for types or labels: today's pass
            return self._decide_on(snapshot, placer, speeds)
        decisions: list[Decision] = []
        for pool in split.pools:  # a job's GPUs, extras and victims are all of its pool's type
            pool_placer = SelectorPlacement(placer, pool.allowed) if pool.allowed else placer
            decisions.extend(self._decide_on(pool.snapshot, pool_placer, speeds))
        return decisions

    def _decide_on(
        self, snapshot: Snapshot, placer: Placement, speeds: SpeedTables | None
    ) -> list[Decision]:
        """A fresh core's decisions on ``snapshot``, placed by ``placer``."""
        core, views = self._core_from(snapshot, speeds)
        plan = core.decide(snapshot.now)
        return plan_to_decisions(plan, {v.id: v for v in views}, snapshot, placer)

    def queue_order(self, snapshot: Snapshot) -> list[str]:
        """Ids of the snapshot's queued jobs in the order this policy would start them.

        Class first, then the policy's own queues (Tiresias' LAS levels), then
        tenant fair share inside a queue, then the queue's own order.  A job
        that does not fit the free GPUs may be passed over by a later one that
        does (first fit); the order is who is considered first.
        """
        core, _ = self._core_from(snapshot)
        return [job.id for job in core.pending_order(snapshot.now)]

    def _core_from(
        self, snapshot: Snapshot, speeds: SpeedTables | None = None
    ) -> tuple[PolicyCore, list[JobView]]:
        """A fresh core holding the snapshot's jobs (running ones restored), and the views in order."""
        core = self.new_core(usable_gpus(snapshot.cluster))
        core.ageing = self.class_ageing_s
        if snapshot.tenants:
            core.fair_share = FairShare(
                {name: t.weight for name, t in snapshot.tenants.items()},
                {name: t.usage for name, t in snapshot.tenants.items()},
                now=snapshot.now,
            )
        views = sorted(snapshot.jobs, key=view_order)
        now, ageing = snapshot.now, self.class_ageing_s
        records = [
            record_from_view(view, idx, now, ageing, speeds) for idx, view in enumerate(views)
        ]
        core.restore_many([rec for rec in records if rec.running], now)
        for rec in records:
            if not rec.running:
                core.add(rec, now)
        return core, views


Entry = TypeVar("Entry", bound=tuple[Any, ...])  # a heap entry: compared as a tuple


def push_all(heap: list[Entry], entries: list[Entry]) -> None:
    """Put ``entries`` on ``heap`` with one heapify (bulk restores: the same pops as a push each)."""
    if entries:
        heap.extend(entries)
        heapq.heapify(heap)


def fair_order(jobs: list[JobRecord], fair_share: FairShare | None) -> list[JobRecord]:
    """``jobs`` stably re-ordered by tenant key (below share first); the same list when off.

    Sorts only when fair share is on and more than one tenant is among the jobs,
    so a single-tenant queue costs nothing.
    """
    if fair_share is None or not fair_share.active(j.tenant for j in jobs):
        return jobs
    key = fair_share.key
    return sorted(jobs, key=lambda j: key(j.tenant))


def appended_in_order(container: Sequence[JobRecord], added: int) -> bool:
    """Whether ``container``, whose last ``added`` jobs were just appended in ``idx`` order,
    is still in ``idx`` order (the appended ones all come after the ones before them)."""
    if added <= 0 or added >= len(container):
        return True
    return container[-added - 1].idx < container[-added].idx


_GPU_ID = attrgetter("id")
_GPU_STATE = attrgetter("state")


def usable_gpus(cluster: Cluster) -> int:
    """``cluster.total_gpus`` (the GPUs not down), counted without a Python loop per GPU."""
    gpus = cluster.gpus
    return len(gpus) - sum(map(is_, map(_GPU_STATE, gpus), repeat(GpuState.DOWN)))


def view_order(view: JobView) -> tuple[int, float, float, str]:
    """A job's place in the order a fresh core meets the jobs: running first, then by
    ``queue_since`` (or submit time), submit time and id."""
    since = view.queue_since if view.queue_since is not None else view.submit_time
    return (0 if view.running else 1, since, view.submit_time, view.id)


def record_from_view(
    view: JobView,
    idx: int,
    now: float,
    ageing: float | None = None,
    speeds: SpeedTables | None = None,
) -> JobRecord:
    """A working record for a view; the class ageing gives it comes from its wait.

    A queued job has waited since ``queue_since`` (or submit); the core's
    ``add`` ages it.  A running job keeps the class it started with: the view
    knows only its wait from submit to its current start (``queue_since``, or
    ``now`` when unknown), exact for a job never stopped before and an
    over-estimate for one that was, which errs towards not preempting it.
    """
    speed: list[float] | None = None
    if view.throughput:
        if speeds is not None:
            speed = speeds.table(view.throughput, view.requested_gpus, view.max_gpus)
        else:
            speed = view_speeds(view.throughput, view.requested_gpus, view.max_gpus)
    remaining = view.remaining_work if view.remaining_work is not None else float("inf")
    rec = JobRecord(
        view.id,
        idx,
        view.submit_time,
        view.requested_gpus,
        remaining,
        tenant=view.tenant,
        min_gpus=view.min_gpus,
        max_gpus=view.max_gpus,
        speed=speed,
        klass=priority_class(view.priority),
        weight=view.weight,
        interactive=view.interactive,
    )
    since = view.queue_since if view.queue_since is not None else view.submit_time
    rec.pending_since = since
    if speed is not None and len(speed) > 1 and speed[1] > 0:
        rec.gain_ref = 1.0 / speed[1]  # throughput(requested) / throughput(1)
    rec.attained = view.attained_service
    rec.executed = view.attained_service / max(1, len(view.gpus) or view.requested_gpus)
    rec.q_exec = rec.executed
    rec.last = now
    rec.resume_at = now
    if view.running:
        rec.running = True
        rec.alloc = len(view.gpus)
        rec.start_time = view.queue_since
        started = view.queue_since if view.queue_since is not None else now
        rec.klass = aged_class(rec.own_klass, started - view.submit_time, ageing)
    return rec


def plan_to_decisions(
    plan: Plan,
    views: Mapping[str, JobView],
    snapshot: Snapshot,
    placer: Placement,
    *,
    free: Collection[int] | None = None,
    gpu_info: Mapping[int, Gpu] | None = None,
) -> list[Decision]:
    """Turn size changes into GPU tuples: release first, then shrink, then place growth.

    The cluster's free GPUs are looked at only when something grows (a pass
    that only stops or shrinks jobs, or does nothing, never walks the GPUs).
    ``free`` and ``gpu_info``: the snapshot's free GPU ids and its GPUs by id, from
    a caller that keeps them between passes (default: read from the snapshot).
    """
    released: list[int] = []
    decisions: list[Decision] = []
    grows: list[tuple[JobRecord, int]] = []
    for job, n in plan:
        current = views[job.id].gpus
        if n <= 0:
            decisions.append(Preempt(job.id))
            released.extend(current)
            placer.release(job.id)
        elif current and n < len(current):
            keep = current[:n]
            released.extend(current[n:])
            decisions.append(Scale(job.id, keep))
        elif n != len(current):
            grows.append((job, n))
    if not grows:
        return decisions
    gpus = snapshot.cluster.gpus
    if free is None:
        free = set(
            compress(map(_GPU_ID, gpus), map(is_, map(_GPU_STATE, gpus), repeat(GpuState.FREE)))
        )
    if gpu_info is None:
        gpu_info = dict(zip(map(_GPU_ID, gpus), gpus, strict=True))
    free = {*free, *released}
    for job, n in grows:
        current = views[job.id].gpus
        extra = placer.place(n - len(current), sorted(free), gpu_info, near=current, job=job.id)
        if extra is None:
            continue  # does not fit on real GPUs after all; the next tick retries
        free.difference_update(extra)
        if current:
            decisions.append(Scale(job.id, tuple(current) + extra))
        else:
            # A start above its base carries extras: the binder may start it on the base alone.
            base = job.base if 0 < job.base < n else 0
            decisions.append(Start(job.id, extra, base))
    return decisions


def decisions_touch(decisions: Sequence[Decision]) -> set[str]:
    """The job ids a list of decisions changes (handy for callers and tests)."""
    return {d.job for d in decisions if isinstance(d, Start | Preempt | Scale | Migrate)}
