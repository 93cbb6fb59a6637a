"""Tenant quotas over one pass's decisions (pure): the one place their rules are written.

A tenant's jobs may hold at most its quota of GPUs at once, counting each
job's requested share (:func:`quota_share`: the GPUs it holds, at most its
request); GPUs a job holds above its request are idle extras the policy
reclaims first, so they do not count.  Three rules, used by every pass
(``scheduler.pipeline``: the live tick, the forecast, and the simulator when
its ``SimConfig.quota`` is set):

* the hold-back (:meth:`QuotaBook.hold_reason`): a queued job whose tenant's
  use plus its need (:func:`quota_need`: its minimum) is over the quota is no
  candidate of the pass; the tick applies it while assembling its snapshot
  (``control.state``), the forecast with ``scheduler.pipeline.QuotaHoldBack``;
* the check (:func:`enforce_quotas`): the policy does not know quotas, so its
  starts and its growth toward a request are checked here, in its order, before
  binding, and cut to the size that fits where one does;
* preemption within a tenant (:func:`within_quota_preemptions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.named_numbers import named_numbers
from scheduler.priority import HIGH, LOW, priority_class
from scheduler.types import Decision, JobView, Preempt, Scale, Start


def quota_share(holds: int, requested: int) -> int:
    """GPUs of its tenant's quota a job uses: those it holds, at most its request."""
    return holds if holds < requested else requested


def quota_need(min_gpus: int, requested: int) -> int:
    """GPUs of quota a queued job needs to start: its minimum (its request without one)."""
    return min_gpus or requested


def parse_quota(text: str) -> dict[str, int]:
    """``"a=8,b=16"`` -> GPU quota per tenant; ValueError (one line) on bad input."""
    quota: dict[str, int] = {}
    for part, name, gpus in named_numbers(text, "tenant quota", "a=8,b=16"):
        if not gpus >= 0 or gpus != int(gpus):
            raise ValueError(f"tenant quota {part!r} must be a whole number of GPUs >= 0")
        quota[name] = int(gpus)
    if not quota:
        raise ValueError("no tenant quotas given (use e.g. a=8,b=16)")
    return quota


def over_quota(tenant: str, used: int, quota: int) -> str:
    """Why a job of ``tenant`` waits for its quota (the words users see)."""
    return f"tenant {tenant} holds {used} of its {quota}-GPU quota"


def over_type_quota(tenant: str, gpu_type: str, used: int, quota: int) -> str:
    """Why a job of ``tenant`` waits for its quota of one GPU type (the words users see)."""
    return f"tenant {tenant} holds {used} of its {quota}-GPU quota of {gpu_type}"


@dataclass
class QuotaBook:
    """Quota and requested-share use of each tenant (by slug) at the snapshot.

    ``type_quota`` adds a quota per GPU type (tenant -> type -> GPUs; Kueue's
    flavors) beside the total in ``quota``; ``type_in_use`` is the use by
    ``(tenant, type)`` and ``gpu_types`` each GPU's type (id -> type), read only
    when some tenant has a per-type quota.  A type a tenant has no quota for is
    bounded by its total alone.
    """

    quota: dict[str, int] = field(default_factory=dict)
    in_use: dict[str, int] = field(default_factory=dict)
    type_quota: dict[str, dict[str, int]] = field(default_factory=dict)
    type_in_use: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_types: Mapping[int, str] = field(default_factory=dict)

    def count(self, tenant: str, holds: int, requested: int, gpu_type: str = "") -> None:
        """Add a job holding ``holds`` GPUs (of ``gpu_type``) of a ``requested`` size to
        its tenant's use."""
        share = quota_share(holds, requested)
        self.in_use[tenant] = self.in_use.get(tenant, 0) + share
        if self.type_quota:
            key = (tenant, gpu_type)
            self.type_in_use[key] = self.type_in_use.get(key, 0) + share

    def admits(self, tenant: str, requested: int, gpu_types: Sequence[str] = ()) -> bool:
        """Whether a job of ``tenant`` asking for ``requested`` GPUs (of one of ``gpu_types``;
        empty: any) may be submitted at all: the submission's rule (``jobs.services``)
        refuses a request above the quota, or above the quota of every type it accepts."""
        quota = self.quota.get(tenant)
        if quota is not None and requested > quota:
            return False
        per_type = self.type_quota.get(tenant)
        if not per_type or not gpu_types:  # "any type" fits a type without a quota
            return True
        return any(name not in per_type or requested <= per_type[name] for name in gpu_types)

    def hold_reason(self, tenant: str, need: int, gpu_types: Sequence[str] = ()) -> str | None:
        """The hold-back rule: why a queued job of ``tenant`` that needs ``need`` GPUs
        (:func:`quota_need`) of one of ``gpu_types`` (empty: any) is no candidate now, or
        None when it may be one (it fits its total and some acceptable type's quota, or
        the tenant has no quota)."""
        quota = self.quota.get(tenant)
        if quota is not None:
            used = self.in_use.get(tenant, 0)
            if used + need > quota:
                return over_quota(tenant, used, quota)
        per_type = self.type_quota.get(tenant)
        if not per_type:
            return None
        reasons = []
        for name in gpu_types or sorted(set(self.gpu_types.values()) or {""}):
            room = self.type_room(tenant, name)
            if room is None or need <= room:
                return None
            reasons.append(over_type_quota(tenant, name, per_type[name] - room, per_type[name]))
        return "; ".join(reasons) or None

    def type_room(
        self, tenant: str, gpu_type: str, in_use: Mapping[tuple[str, str], int] | None = None
    ) -> int | None:
        """GPUs of ``gpu_type`` left in ``tenant``'s quota of that type (None: no such quota);
        ``in_use``: the use to count against it (default: the book's)."""
        quota = self.type_quota.get(tenant, {}).get(gpu_type)
        if quota is None:
            return None
        use = self.type_in_use if in_use is None else in_use
        return quota - use.get((tenant, gpu_type), 0)


def enforce_quotas(
    decisions: Sequence[Decision], views: Mapping[str, JobView], book: QuotaBook
) -> tuple[list[Decision], dict[str, str]]:
    """Keep the decisions that fit their tenant's quota, cut down to what fits where a
    smaller size does; say why each job dropped or held back from growing waits.

    Releases count first: a preemption or a shrink frees its share for the rest.  Then,
    in the policy's order, each decision that raises its job's share (:func:`quota_share`:
    a start, or a growth of a job held below its request) is checked for the share it
    adds.  One that does not fit is cut to the largest size that does
    (:func:`_cut_to_fit`): a growth to more than the job holds now, an elastic start to
    no less than its minimum; else it is dropped.  Growth in extras (above the request)
    adds no share and always stands.  A tenant with no quota has no rule.
    """
    in_use = dict(book.in_use)
    type_use = dict(book.type_in_use)
    typed = bool(book.type_quota)
    for decision in decisions:  # releases first: their shares are free for the rest
        view = views.get(decision.job)
        if view is None or not view.gpus or not isinstance(decision, Preempt | Scale):
            continue
        size = 0 if isinstance(decision, Preempt) else len(decision.gpus)
        freed = _added_share(view, size)
        if freed < 0:
            in_use[view.tenant] = in_use.get(view.tenant, 0) + freed
            if typed:
                key = (view.tenant, book.gpu_types.get(view.gpus[0], ""))
                type_use[key] = type_use.get(key, 0) + freed
    kept: list[Decision] = []
    dropped: dict[str, str] = {}
    for decision in decisions:
        view = views.get(decision.job)
        if view is None or not isinstance(decision, Start | Scale):
            kept.append(decision)
            continue
        quota = book.quota.get(view.tenant)
        gpu_type = book.gpu_types.get((view.gpus or decision.gpus or (-1,))[0], "") if typed else ""
        type_room = book.type_room(view.tenant, gpu_type, type_use) if typed else None
        added = _added_share(view, len(decision.gpus))
        if (quota is None and type_room is None) or added <= 0:  # no rule; a shrink, extras
            kept.append(decision)
            continue
        used = in_use.get(view.tenant, 0)
        total_room = quota - used if quota is not None else _NO_LIMIT
        room = total_room if type_room is None else min(total_room, type_room)
        fitting = decision if added <= room else _cut_to_fit(decision, view, room)
        if fitting is None or (isinstance(fitting, Scale) and fitting is not decision):
            dropped[decision.job] = (  # a cut start starts
                over_quota(view.tenant, used, quota)
                if quota is not None and room == total_room
                else _over_type(book, view.tenant, gpu_type, type_use)
            )
        if fitting is not None:
            share = _added_share(view, len(fitting.gpus))
            in_use[view.tenant] = used + share
            if type_room is not None:
                type_use[(view.tenant, gpu_type)] = type_use.get((view.tenant, gpu_type), 0) + share
            kept.append(fitting)
    return kept, dropped


_NO_LIMIT = 1 << 62
"""Room under a quota a tenant does not have (more than any cluster's GPUs)."""


def _over_type(
    book: QuotaBook, tenant: str, gpu_type: str, use: Mapping[tuple[str, str], int]
) -> str:
    quota = book.type_quota[tenant][gpu_type]
    return over_type_quota(tenant, gpu_type, use.get((tenant, gpu_type), 0), quota)


def _added_share(view: JobView, size: int) -> int:
    """Quota share a job of ``view`` adds (negative: frees) when it goes to ``size`` GPUs."""
    requested = view.requested_gpus
    return quota_share(size, requested) - quota_share(len(view.gpus), requested)


def _cut_to_fit(decision: Start | Scale, view: JobView, room: int) -> Start | Scale | None:
    """``decision`` cut to the largest size whose added share fits in ``room`` GPUs of quota
    (its first GPUs, in rank order), or None when no size is worth keeping.

    A growth is kept when it still grows the job; a start only for a job with a minimum
    (``min_gpus``: an elastic job) and at no less than it.  Binders read a start's or a
    resize's size, not its GPU ids (the fabric allocator finds a shape for the size, the
    forecast and the simulator count), so a prefix of the GPUs is a valid decision of that
    size.  Not every size has a vClos shape, so a cut start keeps a smaller size to start
    on (``Start.base``, the binder's fallback): its own base while that is still smaller,
    else the job's minimum.
    """
    # The share it adds never reaches the request here, so each GPU more is one of quota.
    size = quota_share(len(view.gpus), view.requested_gpus) + room
    if isinstance(decision, Scale):
        return Scale(decision.job, decision.gpus[:size]) if size > len(view.gpus) else None
    if not 0 < view.min_gpus <= size:
        return None
    base = decision.base if 0 < decision.base < size else view.min_gpus
    return Start(decision.job, decision.gpus[:size], base if base < size else 0)


@dataclass(frozen=True, slots=True)
class Blocked:
    """A queued job its tenant's quota keeps out: who, its priority, the share it needs."""

    job: str
    tenant: str
    priority: int
    need: int
    """GPUs of quota it needs to start (its minimum)."""


@dataclass(frozen=True)
class QuotaRoom:
    """What the quota step decides: preemptions, why each blocked job served still waits
    this pass, and for which blocked job each stopped job was stopped."""

    preempts: list[Preempt] = field(default_factory=list)
    waits: dict[str, str] = field(default_factory=dict)
    stopped_for: dict[str, str] = field(default_factory=dict)


def within_quota_preemptions(
    blocked: Sequence[Blocked], running: Iterable[JobView], book: QuotaBook
) -> QuotaRoom:
    """Preemptions that make room under a tenant's quota for its own higher-class jobs.

    Kueue's ``withinClusterQueue: LowerPriority``: a queued job that its
    tenant's quota keeps out may stop that same tenant's running jobs of a
    lower priority class (``scheduler.priority``), lowest class first and, in
    a class, the most recently started first (the least work to lose), until
    its minimum fits.  Only when enough can be freed (nothing is stopped for
    nothing); never another tenant's job (quota and fair share decide between
    tenants) nor one of its own class.  Blocked jobs are served highest class
    first, then in the order given; a job stopped for one is not counted for
    the next.  Returns the preemptions and, per blocked job served, why its
    wait goes on this pass (it starts on a later pass, once the GPUs and the
    quota are free).
    """
    room = QuotaRoom()
    use = dict(book.in_use)
    taken: set[str] = set()
    by_tenant: dict[str, list[JobView]] = {}
    for view in running:
        if view.gpus and priority_class(view.priority) != HIGH:  # HIGH is nobody's victim
            by_tenant.setdefault(view.tenant, []).append(view)
    ordered: dict[tuple[str, int], list[JobView]] = {}  # sorted once per tenant and class
    for job in sorted(blocked, key=lambda b: priority_class(b.priority)):
        rank = priority_class(job.priority)
        if job.tenant not in book.quota or job.tenant not in by_tenant or rank == LOW:
            continue
        quota = book.quota[job.tenant]
        short = use.get(job.tenant, 0) + job.need - quota
        if short <= 0 or job.need > quota:
            continue
        key = (job.tenant, rank)
        if key not in ordered:
            ordered[key] = _victims(by_tenant[job.tenant], rank)
        chosen, freed = [], 0
        for victim in (v for v in ordered[key] if v.id not in taken):
            if freed >= short:
                break
            chosen.append(victim)
            freed += quota_share(len(victim.gpus), victim.requested_gpus)
        if freed < short:
            continue
        for victim in chosen:
            taken.add(victim.id)
            room.preempts.append(Preempt(victim.id))
            room.stopped_for[victim.id] = job.job
        use[job.tenant] = use.get(job.tenant, 0) - freed
        names = ", ".join(v.id for v in chosen)
        room.waits[job.job] = (
            f"stopping {names} (a lower class of tenant {job.tenant}) to fit under its "
            f"{quota}-GPU quota"
        )
    return room


def _victims(jobs: Iterable[JobView], above: int) -> list[JobView]:
    """The running jobs of a class below ``above``: lowest class, then latest started first."""
    lower = [v for v in jobs if priority_class(v.priority) > above]
    return sorted(lower, key=lambda v: (-priority_class(v.priority), -(v.queue_since or 0.0), v.id))
