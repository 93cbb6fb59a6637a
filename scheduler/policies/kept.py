"""A policy whose core is kept between passes: a fresh core's decisions, paid for what changed.

:meth:`Policy.schedule` builds a fresh core from the whole snapshot every pass:
a record per job, every running job restored into its queue, every queued one
added.  The control plane's snapshots change by a few jobs a tick, so at
10,000 jobs that rebuild was about half of a tick.  :class:`KeptPolicy` keeps
the *restored* core (as a fresh core stands before it decides) and brings it
to the next snapshot by applying only the jobs whose views changed::

    snapshot n+1
      ├─ views by id: the same object as last pass (the tick keeps an unchanged
      │  job's view), or equal to it → nothing to do
      ├─ gone or changed → core.remove(record)            ┐ the restored core
      ├─ new or changed  → a record, an idx in view order, │ of snapshot n+1:
      │                    core.restore_many / core.add,   │ what a fresh core
      │                    core.reorder (queues by idx)    │ holds before its
      ├─ queued jobs whose aged class moved since: again   │ pass
      ├─ core.restored_books (what a fresh restore books)  ┘
      └─ checkpoint → decide → decisions → rollback (the core and every record
         the pass changed go back to the restored state)

Why the decisions are a fresh core's (tests check it on random snapshot
sequences for every policy, ``scheduler/tests/test_kept_core.py``):

* A fresh core orders everything by ``idx``, the job's position in view order
  (running first, then by ``queue_since`` or submit time, then id), and only
  compares idx values; the kept core gives a new job an idx between its
  neighbours' (renumbering all when no integer is left between them), so
  every comparison comes out the same.
* A record depends on its view, the pass's time and the ageing period.  The
  time enters as ``last``/``resume_at`` (a fresh record's are the pass's time,
  so its pass's ``settle`` changes nothing; a kept record's are +inf, so none
  ever does), as the aged class of a queued job (re-added when the class its
  wait earns moves: the core's own ageing heap says when), and as the class
  of a running low-class job whose view has no ``queue_since`` (remade every
  pass: rare).
* Books beyond the queues are a fresh restore's (``restored_books``): no
  threshold crossings (a fresh restore's never demote in its first pass), one
  scale-out candidate per running job (a removed job's are skipped as dead,
  and swept when many; its idx is not given out again until then).
* What the pass changes is undone: :meth:`PolicyCore.checkpoint` copies the
  core's containers, and the records' fields a core writes (``_DECIDED_FIELDS``)
  are put back where they moved.  Those fields are kept as the restored state
  has them (``RestoredCore.saved``, taken when a record is made or re-added by
  ageing, the only times a restore writes them), so a pass looks at every
  record once, after it, not before and after (2 ms at 10,000 jobs).

What a pass still costs is the policy's own pass (Elastic-Tiresias' compaction
looks at every running job when more than ``N`` wait) and one look at every
record's decided fields; the GPUs are read only where their views changed
(:class:`GpuBooks`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from itertools import compress
from operator import attrgetter, is_not, itemgetter, ne
from typing import Any

from scheduler.curves import SpeedTables
from scheduler.fairshare import FairShare
from scheduler.gpu_types import is_typed
from scheduler.placement import ConsolidatedPlacement, Placement
from scheduler.policies.base import (
    Plan,
    Policy,
    PolicyCore,
    plan_to_decisions,
    record_from_view,
    view_order,
)
from scheduler.priority import AGED_CEILING, priority_class
from scheduler.records import JobRecord
from scheduler.types import Decision, Gpu, GpuState, JobView, Snapshot, TenantShare

#: Room between two neighbours' idx values: a job inserted between them takes the middle.
IDX_GAP = 1 << 32

#: The record fields a core's pass writes (``settle`` writes none: a kept ``last`` is +inf).
_DECIDED_FIELDS = ("klass", "pending_since", "base", "compacted", "queue", "attained", "q_exec")
_DECIDED = attrgetter(*_DECIDED_FIELDS)
_VIEW_ID = attrgetter("id")
_GPU = attrgetter("id", "server", "leaf", "state", "job")  # every field of a GPU view

OrderKey = tuple[int, float, float, str]


class KeptPolicy(Policy):
    """``policy`` with its core kept between passes; :meth:`schedule` decides as ``policy`` does.

    Not pure: it remembers the last snapshot's restored core.  One caller at a
    time (the tick, under its lock).  Any error inside a pass drops the kept
    core: the next pass restores a fresh one.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.class_ageing_s = policy.class_ageing_s
        self.kept: RestoredCore | None = None
        self.rebuilds = 0  # restored cores made from scratch (the first, after errors, resets)

    def new_core(self, total_gpus: int) -> PolicyCore:
        """The wrapped policy's fresh core."""
        return self.policy.new_core(total_gpus)

    def reset(self) -> None:
        """Forget the kept core: the next pass restores one from its whole snapshot."""
        self.kept = None

    def schedule(
        self,
        snapshot: Snapshot,
        placement: Placement | None = None,
        *,
        speeds: SpeedTables | None = None,
    ) -> list[Decision]:
        """The decisions :meth:`Policy.schedule` makes on ``snapshot``, from the kept core.

        A typed snapshot (:func:`scheduler.gpu_types.is_typed`: several GPU types, or a
        job asking for a type or labels) is decided by the wrapped policy's fresh pass,
        pool by pool; the kept core is dropped (it keeps one pool only).
        """
        if is_typed(snapshot):
            self.kept = None
            return self.policy.schedule(snapshot, placement, speeds=speeds)
        kept = self.kept
        if kept is None:
            kept = self.kept = RestoredCore(self.policy)
            self.rebuilds += 1
        try:
            kept.update(snapshot, speeds)
            return kept.decide(snapshot, placement or ConsolidatedPlacement())
        except BaseException:
            self.kept = None  # half-applied: the next pass starts over
            raise


class RestoredCore:
    """A policy core in its restored state for the last snapshot, with each job's record."""

    def __init__(self, policy: Policy) -> None:
        self.ageing = policy.class_ageing_s
        self.core = policy.new_core(0)
        self.core.ageing = self.ageing
        self.tenants: Mapping[str, TenantShare] = {}
        self.views: dict[str, JobView] = {}
        self.records: dict[str, JobRecord] = {}
        self.order: list[tuple[OrderKey, int]] = []  # (view order key, idx), sorted
        self.clocked: set[str] = set()  # running low-class jobs whose class moves with time
        self.gpus = GpuBooks()
        self.retired: set[int] = set()  # idx of removed running jobs, until swept
        # Each record's fields a core's pass writes (``_DECIDED_FIELDS``) as the restored
        # state has them, in the records' own order: what :meth:`decide` puts back.
        self.saved: dict[str, tuple[Any, ...]] = {}

    # -- bringing the restored core to a snapshot -----------------------------------
    def update(self, snapshot: Snapshot, speeds: SpeedTables | None) -> None:
        """Apply the jobs that changed since the last snapshot (all of them the first time)."""
        now, core, jobs = snapshot.now, self.core, snapshot.jobs
        core.total = self.gpus.update(snapshot.cluster.gpus)
        rekey = self._fair_share(snapshot.tenants, now)
        ids = list(map(_VIEW_ID, jobs))
        old, new = self.views, dict(zip(ids, jobs, strict=True))
        # An unchanged job's view is the same object (the tick keeps it), else equal to it.
        fresh = list(compress(jobs, map(is_not, map(old.get, ids), jobs)))
        if fresh:
            fresh = [view for view in fresh if old.get(view.id) != view]
        fresh += [new[job] for job in self.clocked if job in new and _same(old[job], new[job])]
        gone = sorted(old.keys() - new.keys())
        self._remove([*gone, *(v.id for v in fresh if v.id in old)], now)
        if len(self.retired) > len(self.records) // 4 + 64:
            core.restored_books(removed=True, rekey=None)  # the removed jobs' entries go
            self.retired.clear()
        self.views = new
        renumbered = self._insert(fresh, now, speeds)
        self._age(now)
        running = None
        if rekey or renumbered:
            running = [rec for rec in self.records.values() if rec.running]
            self.retired.clear()  # every entry made again
        core.restored_books(removed=False, rekey=running)

    def _fair_share(self, tenants: Mapping[str, TenantShare], now: float) -> bool:
        """The snapshot's fair share on the core; True when its tenants' keys may have moved."""
        core = self.core
        if tenants == self.tenants and (core.fair_share is not None) == bool(tenants):
            return False
        self.tenants = tenants
        core.fair_share = (
            FairShare(
                {name: t.weight for name, t in tenants.items()},
                {name: t.usage for name, t in tenants.items()},
                now=now,
            )
            if tenants
            else None
        )
        return True

    def _remove(self, jobs: Iterable[str], now: float) -> None:
        """Take these jobs out of the core.

        Their records are made dead to every heap entry still naming them
        (ageing, scale-out candidates: a core skips an entry whose job neither
        runs nor waits); a running one's idx is retired until its entries are
        swept, so that no new job's entry ever ties with one of them.
        """
        for job in jobs:
            rec = self.records.pop(job)
            del self.saved[job]
            self.core.remove(rec, now)
            key = view_order(self.views[job])
            del self.order[bisect.bisect_left(self.order, (key,))]
            self.clocked.discard(job)
            if rec.running:
                self.retired.add(rec.idx)
            rec.running, rec.alloc, rec.end_time = False, 0, now

    def _insert(self, views: list[JobView], now: float, speeds: SpeedTables | None) -> bool:
        """Records for these views, restored or added; True when every idx was renumbered."""
        if not views:
            return False
        renumbered = False
        made: list[JobRecord] = []
        views.sort(key=view_order)  # a first pass appends each: no gap is halved twice
        for view in views:
            idx, moved = self._place(view_order(view))
            renumbered = renumbered or moved
            rec = record_from_view(view, idx, now, self.ageing, speeds)
            # Never settled: a fresh record's ``last`` is the pass's time, so its passes'
            # ``settle(now)`` change nothing; from +inf none ever does, whatever ``now``.
            rec.last = rec.resume_at = math.inf
            self.records[view.id] = rec
            if (
                view.running
                and view.queue_since is None
                and self.ageing is not None
                and priority_class(view.priority) > AGED_CEILING
            ):
                self.clocked.add(view.id)
            made.append(rec)
        if renumbered:  # the idx of records made before the renumbering moved too
            for key, idx in self.order:
                self.records[key[3]].idx = idx
            self.core.restored_books(removed=False, rekey=())  # entries with old idx go
        made.sort(key=_idx)
        core = self.core
        core.restore_many([rec for rec in made if rec.running], now)
        for rec in made:
            if not rec.running:
                core.add(rec, now)
        core.reorder(made)
        for view in views:  # the records' order (``views``'), as made above
            self.saved[view.id] = _DECIDED(self.records[view.id])
        return renumbered

    def _place(self, key: OrderKey) -> tuple[int, bool]:
        """An idx for a job at ``key`` in view order; True when every idx had to be renumbered."""
        order = self.order
        at = bisect.bisect_left(order, (key,))
        below = order[at - 1][1] if at > 0 else None
        above = order[at][1] if at < len(order) else None
        if below is None:  # the first: a gap's width below the next (0 for the very first)
            below = (above if above is not None else IDX_GAP) - 2 * IDX_GAP
        if above is None:
            above = below + 2 * IDX_GAP
        idx = self._unused(below, above)
        if idx is not None:
            order.insert(at, (key, idx))
            return idx, False
        order.insert(at, (key, 0))
        self.order = order = [(k, i * IDX_GAP) for i, (k, _) in enumerate(order)]
        self.retired.clear()  # the caller sweeps every entry: the old numbering is gone
        return order[at][1], True

    def _unused(self, below: int, above: int) -> int | None:
        """The integer nearest the middle of (below, above) that no removed job still holds."""
        middle = (below + above) // 2
        for step in range(len(self.retired) + 1):
            for idx in (middle + step, middle - step):
                if below < idx < above and idx not in self.retired:
                    return idx
        return None

    def _age(self, now: float) -> None:
        """Re-add the queued jobs whose wait earned a higher class since they were added.

        A fresh core adds each queued job with the class its wait earns at the
        pass's time; the kept core added it at an earlier pass.  The core's
        ageing heap holds when each queued job next moves up: those due by now
        are taken out and added again at ``now``.  (Those due within the core's
        slack after ``now`` stay: the pass lifts them, as a fresh core's does.)
        """
        core = self.core
        due = core.take_due_ageing(now)
        if not due:
            return
        for job in due:
            core.remove(job, now)
        due.sort(key=_idx)
        for job in due:
            core.add(job, now)
        core.reorder(due)
        for job in due:
            self.saved[job.id] = _DECIDED(job)

    # -- the pass ---------------------------------------------------------------------
    def decide(self, snapshot: Snapshot, placer: Placement) -> list[Decision]:
        """The core's pass on the restored state, as decisions; then the restored state again."""
        now, core = snapshot.now, self.core
        books = core.checkpoint()
        plan: Plan = core.decide(now)
        decisions = plan_to_decisions(
            plan, self.views, snapshot, placer, free=self.gpus.free, gpu_info=self.gpus.info
        )
        core.rollback(books)
        # The records the pass wrote, put back as the restored state has them (``saved``:
        # kept with the records, so only one pass over them here, not a copy before too).
        records, saved = self.records.values(), self.saved.values()
        assert len(records) == len(saved)
        pairs = zip(records, saved, strict=True)
        moved = compress(pairs, map(ne, saved, map(_DECIDED, records)))
        for rec, before in moved:
            for name, value in zip(_DECIDED_FIELDS, before, strict=True):
                setattr(rec, name, value)
        return decisions


class GpuBooks:
    """The snapshot's GPUs as a pass needs them: how many are up, which are free, by id.

    Brought from one snapshot's GPU views to the next by looking only at the
    positions whose view is another object (the tick keeps an unchanged GPU's
    view), so a pass does not walk 16,384 GPUs in Python.
    """

    def __init__(self) -> None:
        self.views: tuple[Gpu, ...] = ()
        self.down = 0
        self.free: set[int] = set()
        self.info: dict[int, Gpu] = {}

    def update(self, views: tuple[Gpu, ...]) -> int:
        """Take the new snapshot's GPU views; the GPUs not down (``Cluster.total_gpus``)."""
        old = self.views
        if len(old) != len(views):
            self.down, self.free, self.info = 0, set(), {}
            self.views = ()
            self._apply(views, range(len(views)))
        else:
            # Another object where the view changed, or an equal one made again (the GPUs
            # a snapshot sets aside are new views each pass): compare the fields in C.
            other = list(compress(range(len(views)), map(is_not, old, views)))
            if other:
                was, now = _pick(old, other), _pick(views, other)
                self._apply(views, compress(other, map(ne, map(_GPU, was), map(_GPU, now))))
        self.views = views
        return len(views) - self.down

    def _apply(self, views: tuple[Gpu, ...], positions: Iterable[int]) -> None:
        old, free, info = self.views, self.free, self.info
        positions = list(positions)
        for at in positions if old else ():  # every old view first: ids may change places
            gone = old[at]
            self.down -= gone.state is GpuState.DOWN
            free.discard(gone.id)
            held = info.get(gone.id)
            if held is not None and (held is gone or held == gone):  # equal: kept, not taken
                del info[gone.id]
        for at in positions:
            gpu = views[at]
            self.down += gpu.state is GpuState.DOWN
            if gpu.state is GpuState.FREE:
                free.add(gpu.id)
            info[gpu.id] = gpu


def _pick(items: tuple[Gpu, ...], positions: list[int]) -> tuple[Gpu, ...]:
    """``items`` at ``positions``, picked in C."""
    picked = itemgetter(*positions)(items)
    return picked if len(positions) > 1 else (picked,)


def _same(old: JobView | None, new: JobView) -> bool:
    return old is new or (old is not None and old == new)


def _idx(rec: JobRecord) -> int:
    return rec.idx
