"""Elastic-Tiresias (EDL §5.1): Tiresias order, plus scale-in under pressure and scale-out when idle.

What the excerpt says: three queues ("groups") with service quanta 500 and
10,000 GPU-seconds; ``N = 10`` waiting jobs is the threshold; ``r = 0.5`` is
the quality-of-service guarantee; "when all GPUs are busy and a job arrives,
running jobs are scaled in following the R1 rule to release GPUs"; idle GPUs
go to jobs whose throughput still grows ("as long as the scale-out does not
decrease its throughput").  The full rules of §5.1 are not known; we follow
the three-phase reading of a public implementation (PAPERS.md) and write our
choices down here:

1. **Tiresias allocation.**  The 2D-LAS pass of :mod:`scheduler.policies.tiresias`
   over each job's *base* size (its requested GPUs, or its minimum once
   compacted).  GPUs a job holds above its base ("extras", from scale-out)
   are not protected: when starts need them they are reclaimed first, from
   the job that loses the least speedup per GPU (lower queues first on ties).
2. **Compaction** (our reading of R1).  If more than ``N`` jobs still wait,
   every running job below the top queue is scaled in to its minimum,
   ``max(min_gpus, ceil(r x requested))`` — never below ``r`` of the request
   (our reading of ``r``) — and the pass runs again, now also starting
   waiting jobs at their minimum when their request does not fit.  A
   compacted job keeps the minimum as its base; it can grow again only
   through phase 3.
3. **Scale-out** (R2).  While GPUs are free, give one more GPU to the
   running job with the largest marginal gain in speedup (throughput over
   one GPU), up to its ``max_gpus``; stop when no gain is positive.  The
   gains come from each job's throughput curve (``JobRecord.speed``), so the
   curve alone bounds a job: it stops growing at the first size whose next
   GPU adds no throughput (:func:`curve_limit`).  ``max_gpus`` is a second,
   optional bound: the simulator sets it to ``max_scale`` x the request, or
   to :func:`curve_limit` when scale-out is "bounded by the curve only"
   (``--max-scale curve``, EDL's "until no gain is positive"); in the portal
   it is the job's own ``max_gpus``.

Priority classes and fair share (see :mod:`scheduler.policies.tiresias` for
the queues): the reclaim takes extras from the lowest class first, inside a
class from the tenant most above its share first, then by least speedup lost;
scale-out gives idle GPUs to the highest class first, inside a class to the
tenant most below its share first, then by largest gain.

Job weights (``JobView.weight``, default 1.0; a sweep gives promoted trials
more): inside a class and a tenant's share, the reclaim and the scale-out read
a job's weight by the policy's :class:`WeightRule`.  ``proportional`` (the
default) ranks by weight x marginal gain, so idle GPUs go where they add the
most *weighted* speedup (a job of weight 3 grows until its next GPU adds a
third of what a job of weight 1 gains) and extras leave where they cost the
least of it; ``order`` is strict: heavier jobs take every idle GPU their curve
still gains from before a lighter one takes any, and lighter jobs give back
all their extras before a heavier one gives back one; the gain only ranks jobs
of equal weight.  After the scale-out, when a job could still gain from a GPU
that a lighter job of the same tenant (and the same or a lower class) holds
as an extra, the GPU moves (:meth:`ElasticTiresiasCore._rebalance`): under
``proportional`` while the heavier job's weighted gain beats the lighter one's
weighted loss, under ``order`` while the heavier job gains at all; so
promoted trials grow and the rest shrink before they are stopped.  Only GPUs
above a job's base move, one pass at a time, never between equal weights:
with every weight 1.0 both rules decide exactly as without weights.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from scheduler.policies.base import Plan, Policy, push_all
from scheduler.policies.tiresias import TiresiasCore
from scheduler.records import JobRecord

#: EDL §6: quanta of G0 and G1 are 500 and 10,000 GPU-seconds.
ELASTIC_THRESHOLDS: tuple[float, ...] = (500.0, 10_000.0)

_MIN_GAIN = 1e-9

#: A scale-out candidate: (class, tenant key, -rank, -score, queue, idx, job, size).
GrowEntry = tuple[int, float, float, float, int, int, JobRecord, int]


class WeightRule(StrEnum):
    """How job weights rank the claims on extra GPUs (module docstring)."""

    PROPORTIONAL = "proportional"  # weight x marginal gain
    ORDER = "order"  # heavier first; the gain inside one weight


def curve_limit(throughput: Callable[[int], float], start: int, limit: int) -> int:
    """Where R2's growth stops: the size, from ``start`` up, whose next GPU adds no throughput.

    Scale-out adds one GPU at a time while the marginal gain is positive, so
    a job that starts at ``start`` GPUs (its request) ends at the first local
    peak of its curve, never above ``limit`` (the cluster).  A curve that
    dips and rises again (throughput falls when a ring leaves the server)
    stops at the dip: the next GPU would lose throughput.
    """
    n = max(1, min(start, limit))
    here = throughput(n)
    while n < limit:
        nxt = throughput(n + 1)
        if nxt - here <= _MIN_GAIN * max(here, 1.0):
            break
        n, here = n + 1, nxt
    return n


def min_size(job: JobRecord, r: float) -> int:
    """The fewest GPUs a job may run on: ``ceil(r x requested)``, at least its own minimum."""
    return max(1, min(job.requested, max(job.min_gpus, math.ceil(r * job.requested))))


class ElasticTiresiasCore(TiresiasCore):
    """Tiresias core plus compaction, extra-GPU reclaim and marginal-gain scale-out."""

    def __init__(
        self,
        total_gpus: int,
        thresholds: Sequence[float] = ELASTIC_THRESHOLDS,
        *,
        waiting_threshold: int = 10,
        r: float = 0.5,
        compat: bool = False,
        weight_rule: WeightRule = WeightRule.PROPORTIONAL,
    ) -> None:
        super().__init__(total_gpus, thresholds, compat=compat)
        self.n_waiting = waiting_threshold
        self.r = r
        self.by_order = weight_rule is WeightRule.ORDER
        self.weighted = False  # a job of weight other than 1.0 was seen: rebalance extras
        self._compacting = False
        self.extra: dict[JobRecord, int] = {}
        self.extra_total = 0
        self._grow: list[GrowEntry] = []  # scale-out candidates

    # -- sizes ----------------------------------------------------------------
    def fit_size(self, job: JobRecord, free: int) -> int:
        """Requested GPUs if they fit; while compacting, the minimum if that fits."""
        if job.requested <= free:
            job.compacted = False
            return job.requested
        if self._compacting:
            low = min_size(job, self.r)
            if low <= free:
                job.compacted = True
                return low
        return 0

    def _gain(self, job: JobRecord, n: int) -> float:
        """Speedup (over one GPU) gained by going from n to n+1 GPUs."""
        return (job.rate(n + 1) - job.rate(n)) * job.gain_ref / max(job.rate(1), 1e-12)

    def _weighed(self, job: JobRecord, gain: float) -> tuple[float, float]:
        """(rank, score) of ``gain`` on ``job`` by the weight rule: more of either, more claim.

        Weight 1.0 gives (0.0, gain) under ``proportional``: the gain, exactly.
        """
        if self.by_order:
            return job.weight, gain
        return 0.0, gain * job.weight

    def _tenant_key(self, job: JobRecord) -> float:
        fs = self.fair_share
        return fs.key(job.tenant) if fs is not None else 0.0

    def _push_grow(self, job: JobRecord, n: int) -> None:
        entry = self._grow_entry(job, n)
        if entry is not None:
            heapq.heappush(self._grow, entry)

    def _grow_entry(self, job: JobRecord, n: int) -> GrowEntry | None:
        """The scale-out candidate of ``job`` at ``n`` GPUs (None: no positive gain left)."""
        if n < job.max_gpus:
            gain = self._gain(job, n)
            if gain > _MIN_GAIN:
                fs = self.fair_share
                key = fs.key(job.tenant) if fs is not None else 0.0
                # inlined _weighed: this runs at every push of a Philly replay
                if self.by_order:
                    return (job.klass, key, -job.weight, -gain, job.queue, job.idx, job, n)
                return (job.klass, key, 0.0, -gain * job.weight, job.queue, job.idx, job, n)
        return None

    def add(self, job: JobRecord, now: float) -> None:
        """A job joins the queue (a weighted one turns the rebalance of extras on)."""
        if job.weight != 1.0:
            self.weighted = True
        super().add(job, now)

    def restore_many(self, jobs: Iterable[JobRecord], now: float) -> None:
        """Snapshot path: a job below its request counts as compacted; above it holds extras.

        The scale-out candidates go in with one heapify (entries are unique by
        job index, so the heap pops as it would after one push per job).
        """
        jobs = list(jobs)
        super().restore_many(jobs, now)
        entries = []
        for job in jobs:
            if job.weight != 1.0:
                self.weighted = True
            alloc, requested = job.alloc, job.requested
            if alloc > requested:
                self.queues[job.queue].run_gpus -= alloc - requested
                job.base = requested
                self.extra[job] = alloc - requested
                self.extra_total += alloc - requested
            elif alloc < requested:
                job.compacted = True
            entry = self._grow_entry(job, alloc)
            if entry is not None:
                entries.append(entry)
        push_all(self._grow, entries)

    def restored_books(self, *, removed: bool, rekey: Sequence[JobRecord] | None) -> None:
        """Scale-out candidates as a fresh restore makes them: one per running job.

        The entries of removed jobs go; with ``rekey`` (the fair share or the
        jobs' idx moved), every entry is made again.
        """
        super().restored_books(removed=removed, rekey=rekey)
        if rekey is not None:
            self._grow = [e for job in rekey if (e := self._grow_entry(job, job.alloc))]
            heapq.heapify(self._grow)
        elif removed:
            self._grow = [e for e in self._grow if e[6].running]
            heapq.heapify(self._grow)

    def remove(self, job: JobRecord, now: float) -> None:
        """A job finished: its extras go with it."""
        super().remove(job, now)
        self.extra_total -= self.extra.pop(job, 0)

    def unplaced(self, refused: Plan, now: float) -> None:
        """Undo refused changes: a start loses its extras and waits; a resize keeps its GPUs.

        A refused growth drops the extras it would have added; a refused
        shrink keeps the GPUs above the job's new base as extras, which the
        next pass reclaims first when starts need them.
        """
        starts: Plan = []
        for job, n in refused:
            if not job.running:
                self.extra_total -= self.extra.pop(job, 0)
                starts.append((job, n))
                continue
            delta = n - job.alloc
            if delta > 0:
                take = min(self.extra.get(job, 0), delta)
                left = self.extra.get(job, 0) - take
                if left:
                    self.extra[job] = left
                else:
                    self.extra.pop(job, None)
                self.extra_total -= take
            elif delta < 0:
                self.extra[job] = self.extra.get(job, 0) - delta
                self.extra_total -= delta
            self.resized(job, now, job.alloc)
            self._push_grow(job, job.alloc)
        super().unplaced(starts, now)
        if len(starts) < len(refused):
            self._wake = self._next_check(now)

    # -- the pass -----------------------------------------------------------------
    def decide(self, now: float) -> Plan:
        """Phase 1 (Tiresias), phase 2 (compaction), reclaim, phase 3 (scale-out)."""
        self._apply_demotions(now)
        if self._promote_heap:
            self._apply_promotions(now)
        if self._age_heap:
            self.apply_ageing(now)
        target: dict[JobRecord, int] = {}
        self._compacting = False
        self._merge(self._pass(now), target)
        if self.waiting > self.n_waiting:
            self._compact(target)
            self._compacting = True
            self._merge(self._pass(now), target)
            self._compacting = False
        in_use = sum(q.run_gpus for q in self.active_queues) + self.extra_total
        if in_use > self.total:
            self._reclaim(in_use - self.total, target)
            in_use = self.total
        if in_use < self.total:
            self._scale_out(self.total - in_use, target)
        if self.weighted and self.extra:
            self._rebalance(target)
        self._wake = self._next_check(now)
        return self._emit(target, now)

    def _merge(self, plan: Plan, target: dict[JobRecord, int]) -> None:
        for job, n in plan:
            target[job] = n
            if n <= 0:
                self.extra_total -= self.extra.pop(job, 0)
            else:
                self._push_grow(job, n)

    def _compact(self, target: dict[JobRecord, int]) -> None:
        """Scale every running job below the top queue in to its minimum (our R1).

        The top queue is level 0 of the highest class with jobs: a higher
        class's served jobs and every lower class's jobs are compacted.
        """
        queues = self.active_queues  # whole classes, in order
        top = 0
        if len(queues) > self.levels:  # more than one class: find the highest with jobs
            for i, q in enumerate(queues):
                if q.running or q.pending or q.tail:
                    top = i - i % self.levels
                    break
        for q in queues[top + 1 :]:
            for job in list(q.running) + q.tail:
                low = min_size(job, self.r)
                if job.compacted and job.base <= low and job not in self.extra:
                    continue
                if target.get(job, 1) <= 0:
                    continue
                self.extra_total -= self.extra.pop(job, 0)
                if job.base > low:
                    q.run_gpus -= job.base - low
                    job.base = low
                job.compacted = True
                target[job] = low
                self._push_grow(job, low)

    def _reclaim(self, need: int, target: dict[JobRecord, int]) -> None:
        """Take ``need`` extra GPUs back, cheapest (weighted) speedup loss first."""
        heap: list[tuple[int, float, float, float, int, int, JobRecord]] = []
        for job in self.extra:
            cur = target.get(job, job.alloc)
            key = self._tenant_key(job)
            rank, loss = self._weighed(job, self._gain(job, cur - 1))
            heap.append((-job.klass, -key, rank, loss, -job.queue, -job.idx, job))
        heapq.heapify(heap)
        while need > 0 and heap:
            nk, nkey, rank, _, nq, ni, job = heapq.heappop(heap)
            cur = target.get(job, job.alloc)
            target[job] = cur - 1
            need -= 1
            self.extra_total -= 1
            left = self.extra[job] - 1
            if left:
                self.extra[job] = left
                loss = self._weighed(job, self._gain(job, cur - 2))[1]
                heapq.heappush(heap, (nk, nkey, rank, loss, nq, ni, job))
            else:
                del self.extra[job]
            self._push_grow(job, cur - 1)

    def _scale_out(self, free: int, target: dict[JobRecord, int]) -> None:
        """Give free GPUs one at a time to the largest positive marginal gain."""
        heap = self._grow
        fs = self.fair_share
        if fs is not None and fs.active(e[6].tenant for e in heap):
            # tenant keys moved since the entries were pushed: re-key the valid ones
            heap[:] = [
                (e[0], fs.key(e[6].tenant), *e[2:]) for e in heap if self._grow_valid(e, target)
            ]
            heapq.heapify(heap)
        elif len(heap) > 8 * (len(self.extra) + 64) + 4 * self.total:
            heap[:] = [e for e in heap if self._grow_valid(e, target)]
            heapq.heapify(heap)
        while free > 0 and heap:
            entry = heapq.heappop(heap)
            if not self._grow_valid(entry, target):
                continue
            job, n = entry[6], entry[7]
            target[job] = n + 1
            self.extra[job] = self.extra.get(job, 0) + 1
            self.extra_total += 1
            free -= 1
            self._push_grow(job, n + 1)

    def _rebalance(self, target: dict[JobRecord, int]) -> None:
        """Move extras from lighter jobs to heavier ones that still gain (module docstring).

        Each move raises the sum of weight x speedup (``proportional``) or
        moves a GPU to a strictly heavier job (``order``), so the loop ends; at
        most ``total`` moves a pass.
        """
        heap, kept = self._grow, []
        moves = 0
        while heap and moves < self.total:
            entry = heapq.heappop(heap)
            if not self._grow_valid(entry, target):
                continue
            job, n = entry[6], entry[7]
            giver = self._giver(job, -entry[3], target)
            if giver is None:
                kept.append(entry)
                continue
            left = target.get(giver, giver.alloc) - 1
            target[giver] = left
            if self.extra[giver] > 1:
                self.extra[giver] -= 1
            else:
                del self.extra[giver]
            self._push_grow(giver, left)
            target[job] = n + 1
            self.extra[job] = self.extra.get(job, 0) + 1
            self._push_grow(job, n + 1)
            moves += 1
        for entry in kept:
            heapq.heappush(heap, entry)

    def _giver(
        self, taker: JobRecord, score: float, target: dict[JobRecord, int]
    ) -> JobRecord | None:
        """The lighter job whose extra GPU ``taker`` (weighted gain ``score``) may take, cheapest
        first; None if none may."""
        best: tuple[float, float, int, JobRecord] | None = None
        for job in self.extra:
            if (
                job.weight >= taker.weight
                or job.tenant != taker.tenant
                or job.klass < taker.klass
                or job is taker
            ):
                continue
            rank, loss = self._weighed(job, self._gain(job, target.get(job, job.alloc) - 1))
            if not self.by_order and loss >= score:
                continue
            key = (rank, loss, -job.idx, job)
            if best is None or key[:3] < best[:3]:
                best = key
        return best[3] if best is not None else None

    def _grow_valid(self, entry: GrowEntry, target: dict[JobRecord, int]) -> bool:
        job, n = entry[6], entry[7]
        cur = target.get(job)
        if cur is None:
            cur = job.alloc if job.running else 0
        return cur == n and cur > 0

    def _emit(self, target: dict[JobRecord, int], now: float) -> Plan:
        shrink: Plan = []
        grow: Plan = []
        stop: Plan = []
        for job, n in target.items():
            if n <= 0:
                if job.running:
                    stop.append((job, 0))
                continue
            if job.running:
                if n == job.alloc:
                    continue
                self.resized(job, now, n)
                (shrink if n < job.alloc else grow).append((job, n))
            else:
                if n != job.base:
                    self._started(job, now, n)
                grow.append((job, n))
        return stop + shrink + grow


class ElasticTiresiasPolicy(Policy):
    """Elastic-Tiresias with EDL's parameters (quanta 500/10,000, N=10, r=0.5)."""

    name = "elastic-tiresias"
    elastic = True

    def __init__(
        self,
        thresholds: Sequence[float] = ELASTIC_THRESHOLDS,
        *,
        waiting_threshold: int = 10,
        r: float = 0.5,
        compat: bool = False,
        weight_rule: WeightRule | str = WeightRule.PROPORTIONAL,
    ) -> None:
        if not 0 < r <= 1:
            raise ValueError("r must be in (0, 1]")
        if waiting_threshold < 0:
            raise ValueError("the waiting-jobs threshold N must be >= 0")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.waiting_threshold = waiting_threshold
        self.r = r
        self.compat = compat
        try:
            self.weight_rule = WeightRule(weight_rule)
        except ValueError:
            choices = ", ".join(WeightRule)
            raise ValueError(f"unknown weight rule {weight_rule!r} (choose {choices})") from None

    def new_core(self, total_gpus: int) -> ElasticTiresiasCore:
        """A fresh Elastic-Tiresias core."""
        return ElasticTiresiasCore(
            total_gpus,
            self.thresholds,
            waiting_threshold=self.waiting_threshold,
            r=self.r,
            compat=self.compat,
            weight_rule=self.weight_rule,
        )
