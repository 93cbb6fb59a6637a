"""The policy's snapshot assembled from rows already read (pure), kept between ticks.

The full rebuild and the incremental tick hand the same rows to the same code:
:func:`assemble_snapshot` is a fresh :class:`Assembly` with every job new.  The
incremental tick keeps its ``Assembly`` (``control.incremental``) and says which
jobs changed since the last call; only those jobs, and the jobs whose
contribution depends on something that changed with them, are assembled again::

    a job's part            depends on                     made again when
    ────────────            ──────────                     ───────────────
    left out (switching,    its row                        its row changes
      profiling)
    held back (quota)       its row, its tenant's use      its row, its tenant's row, or
                              and quota                      its tenant's use changes
    shown (its JobView)     its row, holdings, last        its row or its tenant's row
                              state change, curve,           changes, or it starts or
                              tenant's name, ends-soon       stops ending soon

A job's held GPUs, last state change and curve change only with its row (the
kept state reads them again for the changed jobs).  At 10,000 jobs the loop
over every row was about 12 ms of a 70 ms tick; what is left per call is the
few tenants and copies (the shown views are kept in the rows' order, a bisect
per change).  ``rows`` must be in (submitted, id) order, as both ticks read them.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import compress
from operator import is_not
from typing import Any, Protocol

from control.fair_share import tenant_shares
from fabric.topology import FabricSpec
from jobs.agent_commands import runtime_job_name
from jobs.choices import ACTIVE_STATES, JobState
from scheduler.curves import policy_curve
from scheduler.quota import Blocked, QuotaBook, quota_need, quota_share
from scheduler.throughput import curves_by_type
from scheduler.types import Cluster, GpuState, JobView, ServerCapacity, Snapshot
from scheduler.types import Gpu as GpuView
from scheduler.types import JobState as ViewState

# The states the per-job code compares with, looked up once (an enum member's look-up on
# its class costs more than the comparison).
_QUEUED, _RUNNING, _SCALING = JobState.QUEUED, JobState.RUNNING, JobState.SCALING


@dataclass(frozen=True, slots=True)
class JobRow:
    """What the snapshot needs of one queued, running or scaling job (curves parsed)."""

    id: int
    state: str
    parallelism: int
    tenant_id: int
    submitted_at: datetime
    gpus: int
    min_gpus: int
    max_gpus: int
    attained_gpu_seconds: float
    priority: int
    profiled: dict[int, float]
    measured: dict[int, float]
    profile_state: str
    weight: float = 1.0  # its claim on idle GPUs (``Job.sched_weight``: a sweep's promoted trials)
    gpu_types: tuple[str, ...] = ()  # the GPU types it accepts, preferred first (empty: any)
    selector: tuple[tuple[str, str], ...] = ()  # labels a server must carry (sorted pairs)
    cpus_per_gpu: int = 0  # host CPU cores it needs beside each GPU (0: none asked)
    mem_per_gpu_mib: int = 0  # host memory it needs beside each GPU (0: none asked)
    workload: str = ""  # its model, for its curve on other GPU types ("": a program)
    ran_on_type: str = ""  # the GPU type its measured curve comes from ("": none yet)
    interactive: bool = False  # a session (``Job.kind``): same-class batch work never preempts it


@dataclass(frozen=True, slots=True)
class TenantRow:
    """What the snapshot needs of a tenant with jobs in it."""

    slug: str
    gpu_quota: int
    profile_jobs: bool
    priority_weight: float
    gpu_type_quota: Any = ()
    """Its quota per GPU type as sorted ``(type, GPUs)`` pairs (a JSON object, or its text,
    as read: made pairs here, so rows read any way compare equal)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_type_quota", type_quota_pairs(self.gpu_type_quota))


def type_quota_pairs(quota: Any) -> tuple[tuple[str, int], ...]:
    """A tenant's quota per GPU type as read (a JSON object, its text, or pairs) as sorted
    ``(type, GPUs)`` pairs, so that rows read any way compare equal."""
    if isinstance(quota, str):
        quota = json.loads(quota)
    if isinstance(quota, Mapping):
        quota = tuple(sorted((str(k), int(v)) for k, v in quota.items()))
    return tuple(quota or ())


@dataclass(frozen=True)
class PolicyInput:
    """What the tick hands the policy, and what it needs to act on the answer."""

    snapshot: Snapshot
    ids: dict[str, int]  # job name in the snapshot -> database id
    held_back: dict[int, str]  # queued jobs kept out by their tenant's quota -> why
    book: QuotaBook  # quota and use per tenant, to check the policy's starts
    profile_candidates: tuple[int, ...]  # running at max, never profiled, tenant profiles
    # In ``scaling`` (left out), each since its latest state change: the switch watchdog's.
    switching: dict[int, datetime] = field(default_factory=dict)
    # The held-back jobs as the quota step sees them (``scheduler.quota.within_quota_preemptions``).
    blocked: tuple[Blocked, ...] = ()


class Held(Protocol):
    """What the assembly reads of the cluster (``control.state.ClusterState`` has it)."""

    @property
    def spec(self) -> FabricSpec: ...

    @property
    def holdings(self) -> Mapping[int, list[int]]: ...

    @property
    def gpu_types(self) -> Mapping[int, str]: ...

    @property
    def server_labels(self) -> Mapping[int, tuple[tuple[str, str], ...]]: ...


def set_aside(gpus: tuple[GpuView, ...], held: Collection[int]) -> tuple[GpuView, ...]:
    """``gpus`` with the ``held`` ones shown as down: none of them the policy's to give.

    For the GPUs of jobs the snapshot leaves out (switching, profiling): the
    policy counts every GPU that is not down as its own, so without this it
    would plan to start and grow jobs on GPUs those jobs hold, and placement
    would refuse the plan, tick after tick, while the jobs it could have made
    room for wait.
    """
    if not held:
        return gpus
    out = list(gpus)
    for index in set(held):
        # The views are in index order; a cluster's indices are 0..n-1, so a view is found
        # at its index (a copy and a few look-ups, not a pass over every GPU of the cluster).
        if not (0 <= index < len(out) and out[index].id == index):
            aside = frozenset(held)  # indices with gaps: look at every view
            return tuple(_down(g) if g.id in aside else g for g in gpus)
        out[index] = _down(out[index])
    return tuple(out)


class KeptAside:
    """:func:`set_aside` kept between snapshots: a GPU whose view and whose setting aside
    did not change keeps its shown view, the same object.

    The policy's GPU books (``scheduler.policies.kept.GpuBooks``) read again only
    the positions whose view is another object; set aside afresh, every GPU of a
    switching or profiling job was a new view each tick (thousands at 10,000 jobs),
    made, then compared field by field.  Here only the positions whose view or whose
    setting aside changed are made again.  Same answer as :func:`set_aside`.
    """

    __slots__ = ("gpus", "held", "shown")

    def __init__(self) -> None:
        self.gpus: tuple[GpuView, ...] = ()
        self.held: frozenset[int] = frozenset()
        self.shown: list[GpuView] = []

    def __call__(self, gpus: tuple[GpuView, ...], held: Collection[int]) -> tuple[GpuView, ...]:
        """``set_aside(gpus, held)``, made again only where it changed since the last call."""
        aside = frozenset(held)
        if len(gpus) == len(self.gpus):
            changed = set(compress(range(len(gpus)), map(is_not, self.gpus, gpus)))
            changed.update(aside ^ self.held)
            shown, count = self.shown, len(gpus)
            for index in changed:
                # Views are in index order, a view at its index (as set_aside finds them).
                if not (0 <= index < count and (g := gpus[index]).id == index):
                    break
                shown[index] = _down(g) if index in aside else g
            else:
                self.gpus, self.held = gpus, aside
                return tuple(shown)
        self.shown = list(set_aside(gpus, aside))
        self.gpus, self.held = gpus, aside
        return tuple(self.shown)


def _down(g: GpuView) -> GpuView:
    return GpuView(g.id, g.server, g.leaf, GpuState.DOWN, g.job, g.gpu_type)


@dataclass(slots=True)
class _Part:
    """What one job contributes to the snapshot: left out, held back, or shown."""

    tenant_id: int
    key: tuple[datetime, int]  # its row's place: (submitted, id)
    view: JobView | None = None  # shown to the policy
    blocked: Blocked | None = None  # held back by its tenant's quota, with why
    reason: str = ""
    switching: datetime | None = None  # left out in ``scaling``, since its last change
    left_out: bool = False
    profile: bool = False  # a profiling candidate


@dataclass(slots=True)
class _Inputs:
    """One call's inputs that every job's part reads."""

    holdings: Mapping[int, list[int]]
    tenants: Mapping[int, TenantRow]
    about_to_end: Collection[int]
    since: Mapping[int, datetime]
    base: float
    curves: dict[int, tuple[int, Mapping[int, float]]] | None
    views: dict[int, JobView] | None
    # The cluster's GPU types (numbered) where some tenant has a quota per type: a queued
    # job that accepts any type is held back only when every type is over its quota.
    type_names: Mapping[int, str] = field(default_factory=dict)
    # Each GPU type's speed on a cluster of types that differ in speed (else empty): a
    # job's view carries its curve per type (``JobView.throughput_by_type``).
    speeds: Mapping[str, float] = field(default_factory=dict)
    gpus_per_server: int = 8


_NO_USE: Mapping[str, int] = {}


class Assembly:
    """The policy's view from rows already read, kept between calls by its owner.

    :meth:`assemble` with ``changed=None`` assembles every job (the full
    rebuild's way, :func:`assemble_snapshot`); with the set of jobs whose rows
    (or held GPUs, last state change, curve) changed since the last call, it
    assembles those again and the jobs that depend on what changed with them
    (the module's table), and answers as a fresh assembly would.
    """

    def __init__(self) -> None:
        self.parts: dict[int, _Part] = {}
        self.tenant_of: dict[int, int] = {}  # job id -> tenant id, of every row seen
        self.by_tenant: dict[int, set[int]] = {}
        self.queued: dict[int, set[int]] = {}  # each tenant's queued jobs (the hold-back's)
        self.shares: dict[int, int] = {}  # active job -> its share of its tenant's quota
        self.in_use: dict[int, int] = {}  # tenant id -> shares summed
        # Per GPU type (the per-type quotas'): active job -> (its type, its share), and
        # tenant id -> type -> shares summed.
        self.typed_shares: dict[int, tuple[str, int]] = {}
        self.type_in_use: dict[int, dict[str, int]] = {}
        self.tenants: dict[int, TenantRow] = {}
        self.ending: frozenset[int] = frozenset()
        # What the parts add up to, kept as parts come and go:
        self.shown: list[JobView] = []  # in the rows' order, their keys in ``order``
        self.order: list[tuple[datetime, int]] = []
        self.ids: dict[str, int] = {}
        self.held_back: set[int] = set()
        self.left_out: set[int] = set()
        self.profile: set[int] = set()
        self.present: dict[int, int] = {}  # tenant id -> its jobs not left out
        self.weighed: dict[int, int] = {}  # tenant id -> its jobs shown

    def assemble(
        self,
        cluster: Held,
        gpus: tuple[GpuView, ...],
        rows: Sequence[JobRow],
        tenants: Mapping[int, TenantRow],
        about_to_end: Collection[int],
        since: Mapping[int, datetime],
        now: datetime,
        *,
        changed: Collection[int] | None = None,
        by_id: Mapping[int, JobRow] | None = None,
        curves: dict[int, tuple[int, Mapping[int, float]]] | None = None,
        epoch: float | None = None,
        views: dict[int, JobView] | None = None,
        aside: KeptAside | None = None,
        server_capacity: Mapping[int, ServerCapacity] | None = None,
        type_speeds: Mapping[str, float] | None = None,
    ) -> PolicyInput:
        """The snapshot of :func:`assemble_snapshot`'s arguments (``by_id``: ``rows`` by id,
        which ``changed`` needs), assembling again only what ``changed`` reaches."""
        if changed is None or by_id is None:
            by_id = {row.id: row for row in rows}
            changed = by_id.keys() | self.parts.keys()
        dirty = self._rows_changed(changed, by_id, cluster)
        ending = frozenset(about_to_end)
        dirty.update(ending ^ self.ending)
        self.ending = ending
        for tenant_id, tenant in tenants.items():
            if self.tenants.get(tenant_id) != tenant:
                dirty.update(self.by_tenant.get(tenant_id, ()))
        self.tenants = dict(tenants)
        base = now.timestamp() if epoch is None else epoch
        inputs = _Inputs(cluster.holdings, tenants, ending, since, base, curves, views)
        if any(tenant.gpu_type_quota for tenant in tenants.values()):
            inputs.type_names = dict(enumerate(sorted(set(cluster.gpu_types.values()))))
        if type_speeds:
            inputs.speeds = _speeds(cluster.gpu_types, type_speeds)
            inputs.gpus_per_server = cluster.spec.gpus_per_server
        for job_id in dirty:
            self._forget(job_id)
            if (row := by_id.get(job_id)) is not None:
                use = self.in_use.get(row.tenant_id, 0)
                type_use = self.type_in_use.get(row.tenant_id, _NO_USE)
                self._remember(job_id, _part(row, use, inputs, type_use))
        return self._policy_input(cluster, gpus, by_id, now, base, aside, server_capacity)

    def _rows_changed(
        self, changed: Iterable[int], by_id: Mapping[int, JobRow], cluster: Held
    ) -> set[int]:
        """Bring the tenants' sets and quota use up to date with the changed rows; the jobs
        to assemble again: those, and the queued jobs of a tenant whose use changed."""
        dirty = set(changed)
        in_use = self.in_use
        was: dict[int, int] = {}  # tenant id -> its use before these changes
        retyped: set[int] = set()  # tenants whose use of some type changed
        for job_id in dirty:
            if (tenant_id := self.tenant_of.pop(job_id, None)) is not None:
                was.setdefault(tenant_id, in_use.get(tenant_id, 0))
                self.by_tenant[tenant_id].discard(job_id)
                self.queued[tenant_id].discard(job_id)
                in_use[tenant_id] = in_use.get(tenant_id, 0) - self.shares.pop(job_id, 0)
                if self._count_type(tenant_id, self.typed_shares.pop(job_id, None), -1):
                    retyped.add(tenant_id)
            if (row := by_id.get(job_id)) is None:
                continue
            tenant_id = self.tenant_of[job_id] = row.tenant_id
            was.setdefault(tenant_id, in_use.get(tenant_id, 0))
            self.by_tenant.setdefault(tenant_id, set()).add(job_id)
            queued = self.queued.setdefault(tenant_id, set())
            if row.state == _QUEUED:
                queued.add(job_id)
            if row.state in ACTIVE_STATES:
                share = self.shares[job_id] = quota_share(row.parallelism, row.gpus)
                in_use[tenant_id] = in_use.get(tenant_id, 0) + share
                held = cluster.holdings.get(job_id)
                typed = (cluster.gpu_types.get(held[0], "") if held else "", share)
                self.typed_shares[job_id] = typed
                if self._count_type(tenant_id, typed, 1):
                    retyped.add(tenant_id)
        for tenant_id, use in was.items():
            if in_use.get(tenant_id, 0) != use or tenant_id in retyped:
                dirty.update(self.queued[tenant_id])
        return dirty

    def _count_type(self, tenant_id: int, typed: tuple[str, int] | None, step: int) -> bool:
        """Count an active job's ``(type, share)`` in (``step`` 1) or out of its tenant's
        use of that type; whether it changed anything."""
        if typed is None or not typed[1]:
            return False
        uses = self.type_in_use.setdefault(tenant_id, {})
        uses[typed[0]] = uses.get(typed[0], 0) + step * typed[1]
        return True

    def _forget(self, job_id: int) -> None:
        """Take a job's part out of the totals."""
        part = self.parts.pop(job_id, None)
        if part is None:
            return
        self._count(job_id, part, -1)
        if part.view is not None:
            at = bisect.bisect_left(self.order, part.key)
            del self.order[at], self.shown[at], self.ids[part.view.id]

    def _remember(self, job_id: int, part: _Part) -> None:
        """Add a job's part to the totals."""
        self.parts[job_id] = part
        self._count(job_id, part, 1)
        if part.view is not None:
            at = bisect.bisect(self.order, part.key)
            self.order.insert(at, part.key)
            self.shown.insert(at, part.view)
            self.ids[part.view.id] = job_id

    def _count(self, job_id: int, part: _Part, step: int) -> None:
        """Count a part in (``step`` 1) or out (-1) of the sets and per-tenant counts."""
        tenant_id, add = part.tenant_id, step > 0
        for flag, jobs in (
            (part.blocked is not None, self.held_back),
            (part.left_out, self.left_out),
            (part.profile, self.profile),
        ):
            if flag:
                (jobs.add if add else jobs.discard)(job_id)
        if not part.left_out:
            self.present[tenant_id] = self.present.get(tenant_id, 0) + step
        if part.view is not None:
            self.weighed[tenant_id] = self.weighed.get(tenant_id, 0) + step

    def _policy_input(
        self,
        cluster: Held,
        gpus: tuple[GpuView, ...],
        by_id: Mapping[int, JobRow],
        now: datetime,
        base: float,
        aside: KeptAside | None,
        server_capacity: Mapping[int, ServerCapacity] | None = None,
    ) -> PolicyInput:
        """The policy's input from the totals: views in the rows' order, then the rest."""
        jobs = tuple(self.shown)
        parts, tenants = self.parts, self.tenants

        def in_order(jobs: Iterable[int]) -> list[int]:  # the rows' order: (submitted, id)
            return sorted(jobs, key=lambda job: (by_id[job].submitted_at, job))

        book = QuotaBook()
        for tenant_id, count in self.present.items():
            if count:
                slug = tenants[tenant_id].slug
                book.quota[slug] = tenants[tenant_id].gpu_quota
                book.in_use[slug] = self.in_use.get(tenant_id, 0)
                if per_type := tenants[tenant_id].gpu_type_quota:
                    book.type_quota[slug] = dict(per_type)
        if book.type_quota:  # some tenant has a quota per type: the checks count by type
            book.gpu_types = cluster.gpu_types
            for tenant_id, uses in self.type_in_use.items():
                if tenant_id in tenants:
                    slug = tenants[tenant_id].slug
                    for name, use in uses.items():
                        book.type_in_use[(slug, name)] = use
        weights = {
            tenants[tenant_id].slug: tenants[tenant_id].priority_weight
            for tenant_id, count in self.weighed.items()
            if count
        }
        held = [g for job in self.left_out for g in cluster.holdings.get(job, ())]
        if aside is not None:
            gpus = aside(gpus, held)
        elif held:
            gpus = set_aside(gpus, held)
        snapshot = Snapshot(
            now=now.timestamp() - base,
            cluster=Cluster(
                gpus=gpus,
                fabric_spec=cluster.spec,
                server_labels=cluster.server_labels,
                server_capacity=server_capacity or {},
            ),
            jobs=jobs,
            tenants=tenant_shares(weights, now),
        )
        held_back = in_order(self.held_back)
        switching = {
            job: part.switching for job in in_order(self.left_out) if (part := parts[job]).switching
        }
        return PolicyInput(
            snapshot,
            dict(self.ids),
            {job: parts[job].reason for job in held_back},
            book,
            tuple(in_order(self.profile)),
            switching,
            tuple(blocked for job in held_back if (blocked := parts[job].blocked) is not None),
        )


def _part(
    row: JobRow, in_use: int, inputs: _Inputs, type_in_use: Mapping[str, int] = _NO_USE
) -> _Part:
    """What ``row``'s job contributes, its tenant using ``in_use`` GPUs of its quota (and
    ``type_in_use`` of each type's)."""
    job_id, state, lo, hi = row.id, row.state, row.min_gpus, row.max_gpus
    key = (row.submitted_at, job_id)
    if state == _SCALING or row.profile_state == "requested":
        # Switching or profiling: its size belongs to the runtime for now.
        since = inputs.since.get(job_id) if state == _SCALING else None
        return _Part(row.tenant_id, key, switching=since, left_out=True)
    tenant = inputs.tenants[row.tenant_id]
    slug = tenant.slug
    views = inputs.views
    view = views.get(job_id) if views is not None else None
    if view is not None and view.tenant != slug:
        view = None  # the tenant was renamed
    if view is not None:
        held = view.gpus  # made from the same row and holdings
    else:
        held = tuple(inputs.holdings.get(job_id, ())) if state == _RUNNING else ()
    profile = bool(tenant.profile_jobs and not row.profile_state and lo < hi and len(held) == hi)
    if state == _QUEUED:
        need = quota_need(lo, row.gpus)
        book = QuotaBook({slug: tenant.gpu_quota}, {slug: in_use})
        if tenant.gpu_type_quota:
            book.type_quota = {slug: dict(tenant.gpu_type_quota)}
            book.type_in_use = {(slug, name): use for name, use in type_in_use.items()}
            book.gpu_types = inputs.type_names
        if (reason := book.hold_reason(slug, need, row.gpu_types)) is not None:
            blocked = Blocked(runtime_job_name(job_id), slug, row.priority, need)
            return _Part(row.tenant_id, key, blocked=blocked, reason=reason, profile=profile)
    if held and job_id in inputs.about_to_end:
        hi = len(held)  # a newcomer would join a job about to end: no growth
    if view is None or view.max_gpus != hi:
        view = _view(row, slug, held, hi, inputs)
    return _Part(row.tenant_id, key, view=view, profile=profile)


def _view(row: JobRow, slug: str, held: tuple[int, ...], hi: int, inputs: _Inputs) -> JobView:
    """A new view of ``row``'s job (growing to ``hi``), kept in the owner's memos."""
    job_id, curves, since = row.id, inputs.curves, inputs.since
    memo = curves.get(job_id) if curves is not None else None
    if memo is not None and memo[0] == hi:
        curve = memo[1]
    else:
        curve = policy_curve(row.profiled, row.measured, hi)
        if curves is not None:
            curves[job_id] = (hi, curve)
    view = JobView(
        id=runtime_job_name(job_id),
        submit_time=row.submitted_at.timestamp() - inputs.base,
        requested_gpus=row.gpus,
        tenant=slug,
        min_gpus=row.min_gpus,
        max_gpus=hi,
        gpus=held,
        attained_service=row.attained_gpu_seconds,
        state=ViewState.RUNNING if held else ViewState.QUEUED,
        priority=row.priority,
        queue_since=since[job_id].timestamp() - inputs.base if job_id in since else None,
        throughput=curve,
        weight=row.weight,
        gpu_types=row.gpu_types,
        selector=row.selector,
        throughput_by_type=(
            curves_by_type(
                curve, row.workload, row.ran_on_type, inputs.speeds, inputs.gpus_per_server
            )
            if inputs.speeds
            else None
        ),
        cpus_per_gpu=row.cpus_per_gpu,
        mem_per_gpu_mib=row.mem_per_gpu_mib,
        interactive=row.interactive,
    )
    if inputs.views is not None:
        inputs.views[job_id] = view
    return view


def _speeds(gpu_types: Mapping[int, str], speeds: Mapping[str, float]) -> dict[str, float]:
    """The speed of each GPU type of the cluster (1.0 unless ``speeds`` names it), when
    they differ; empty when one speed serves every type (no curve per type is needed)."""
    present = {name: speeds.get(name, 1.0) for name in set(gpu_types.values())}
    return present if len(set(present.values())) > 1 else {}


def assemble_snapshot(
    cluster: Held,
    gpus: tuple[GpuView, ...],
    rows: Sequence[JobRow],
    tenants: Mapping[int, TenantRow],
    about_to_end: Collection[int],
    since: Mapping[int, datetime],
    now: datetime,
    curves: dict[int, tuple[int, Mapping[int, float]]] | None = None,
    *,
    epoch: float | None = None,
    views: dict[int, JobView] | None = None,
    aside: KeptAside | None = None,
    server_capacity: Mapping[int, ServerCapacity] | None = None,
    type_speeds: Mapping[str, float] | None = None,
) -> PolicyInput:
    """The policy's view from rows already read: pure, shared by the full and incremental tick.

    ``rows`` are in submission order; ``about_to_end`` are the running jobs that
    end within ``SCALE_OUT_MIN_SECONDS_LEFT``; ``since`` each ageing job's last
    state change.  Times are seconds since ``epoch`` (POSIX seconds; default
    ``now``, which makes the snapshot's own time 0).

    Two memos, kept across calls by their owner, who drops a job's entries when
    the job changes: ``curves`` each job's policy curve (with the largest size
    it was made for), ``views`` each job's view.  A view depends only on its
    job's row, holdings, last state change and curve, on its tenant's name,
    and on ``epoch``, which its owner therefore keeps fixed.  The GPUs of the
    jobs left out (switching, profiling) are set aside (:func:`set_aside`;
    ``aside``: the owner's :class:`KeptAside`, which makes again only what
    changed).  A queued job its tenant's quota keeps out is held back
    (``scheduler.quota``'s rule: the pass's hold-back step, applied here where
    the rows are; a job's share is what it holds, at most its request).

    ``server_capacity``: each server's CPU cores and host memory where known (by
    server id), which binding packs jobs' per-GPU requests into
    (``scheduler.packing``).  ``type_speeds``: each GPU type's speed (1.0 unless
    named); where the cluster's types differ in speed each view carries its curve
    per type (``scheduler.throughput.curves_by_type``: its own curve on the type it
    was measured on, the model's ratio on the others), so a view also depends on
    them, which its owner therefore keeps fixed.
    """
    return Assembly().assemble(
        cluster,
        gpus,
        rows,
        tenants,
        about_to_end,
        since,
        now,
        curves=curves,
        epoch=epoch,
        views=views,
        aside=aside,
        server_capacity=server_capacity,
        type_speeds=type_speeds,
    )
