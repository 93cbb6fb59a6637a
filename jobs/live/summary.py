"""What a tenant's dashboard needs after its jobs change, built once per transaction at commit.

The job events say what happened to one job; a dashboard also shows the
tenant's state counts, its GPUs in use, its jobs' queue positions and its JCT.
Rather than have every open dashboard reload its snapshot for those, the
transaction that changed jobs sends them once, to each tenant group::

    lifecycle.broadcast(job, kind)          (any number of times in a transaction)
      └─ on_commit_once("tenant-summaries") records the tenant, whether the queue may
         have moved (a state change) and whether a job completed
    commit ──> TenantSummaries()  (1 query for counts, 1 for the queue, 1 per completion)
         tenant.counts  {"tenant", "counts": {state: n}, "in_use"}     touched tenants
         tenant.queue   {"tenant", "positions": {job id: position}}    every tenant with
                                                                       queued jobs
         tenant.jct     {"tenant", "jct": {count, mean, median, p95}}  after a completion
         cluster.queue  {"queue_length"}  (to the cluster view)        after a state change

Each replaces its earlier version in a coalesced window (absolute values).
Positions are :func:`queue_ranks`, the same numbers the snapshot shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, F, Sum

from jobs.choices import ACTIVE_STATES, JobState
from jobs.models import Job
from jobs.stats import jct_stats
from utilities.realtime import CLUSTER_GROUP, Message, on_commit_once, tenant_group

POSITIONS_PER_TENANT = 200
"""At most this many positions per tenant event: the dashboard lists the newest 200 jobs."""
QUEUE_EVENT_KINDS = ("job.created", "job.updated")
"""Events that may change a job's state (and so the counts and the queue); progress does not."""


def queue_ranks() -> dict[int, tuple[int, int]]:
    """Every queued job's position (1-based) and tenant: ``{job id: (position, tenant id)}``.

    The forecast's order (``queue_position``, stored at each refresh) with the
    jobs that left the queue since taken out, so positions stay 1, 2, 3...
    between refreshes.  A job queued since the last refresh has none yet.
    """
    return queue_state()[0]


def queue_state() -> tuple[dict[int, tuple[int, int]], int]:
    """:func:`queue_ranks` and the number of queued jobs (ranked or not yet), in one query."""
    queued = (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
        .values_list("pk", "tenant_id", "queue_position")
    )
    ranks: dict[int, tuple[int, int]] = {}
    count = 0
    for count, (pk, tenant, position) in enumerate(queued, start=1):
        if position is not None:  # the unranked come last
            ranks[pk] = (count, tenant)
    return ranks, count


def tenant_counts(tenant_ids: set[int]) -> dict[int, tuple[dict[str, int], int]]:
    """Each tenant's job counts by state and its GPUs in use, in one query."""
    out = {tenant: (dict.fromkeys(JobState.values, 0), 0) for tenant in tenant_ids}
    rows = (
        Job.objects.filter(tenant_id__in=tenant_ids)
        .values("tenant_id", "state")
        .annotate(n=Count("id"), gpus=Sum("parallelism"))
        .order_by()
    )
    in_use = dict.fromkeys(tenant_ids, 0)
    for row in rows:
        out[row["tenant_id"]][0][row["state"]] = row["n"]
        if row["state"] in ACTIVE_STATES:
            in_use[row["tenant_id"]] += int(row["gpus"] or 0)
    return {tenant: (counts, in_use[tenant]) for tenant, (counts, _) in out.items()}


@dataclass
class TenantSummaries:
    """The tenants a transaction touched; at commit, their new counts, queue and JCT."""

    touched: set[int] = field(default_factory=set)
    queue_moved: bool = False
    completed: set[int] = field(default_factory=set)

    def note(self, *, tenant: int, kind: str, state: str) -> None:
        """Record one job event of the transaction."""
        if kind not in QUEUE_EVENT_KINDS:
            return
        self.touched.add(tenant)
        self.queue_moved = True
        if state == JobState.COMPLETED:
            self.completed.add(tenant)

    def __call__(self) -> list[Message]:
        """The transaction's tenant patches (called once, after commit)."""
        if not self.touched:
            return []
        messages: list[Message] = []
        by_tenant: dict[int, dict[str, int]] = {}
        ranks, queued = queue_state() if self.queue_moved else ({}, 0)
        if self.queue_moved:
            for pk, (rank, tenant) in ranks.items():
                shown = by_tenant.setdefault(tenant, {})
                if len(shown) < POSITIONS_PER_TENANT:
                    shown[str(pk)] = rank
        for tenant, (counts, in_use) in sorted(tenant_counts(self.touched).items()):
            payload = {"type": "tenant.counts", "tenant": tenant, "counts": counts}
            messages.append(Message((tenant_group(tenant),), {**payload, "in_use": in_use}))
        if self.queue_moved:
            for tenant in sorted(self.touched | set(by_tenant)):
                positions = by_tenant.get(tenant, {})
                payload = {"type": "tenant.queue", "tenant": tenant, "positions": positions}
                messages.append(Message((tenant_group(tenant),), payload, f"queue-{tenant}"))
        for tenant in sorted(self.completed):
            jct = jct_stats(Job.objects.filter(tenant_id=tenant)).as_dict()
            payload = {"type": "tenant.jct", "tenant": tenant, "jct": jct}
            messages.append(Message((tenant_group(tenant),), payload, f"jct-{tenant}"))
        keyed = [
            Message(m.groups, m.payload, m.replaces or f"counts-{m.payload['tenant']}")
            for m in messages
        ]
        if self.queue_moved:  # the cluster view's queue tile and timeline
            payload = {"type": "cluster.queue", "queue_length": queued}
            keyed.append(Message((CLUSTER_GROUP,), payload, "cluster-queue"))
        return keyed


def note_job_event(*, tenant: int, kind: str, state: str) -> None:
    """Have this transaction's tenant patches include ``tenant`` (sent once, at commit)."""
    on_commit_once(
        "tenant-summaries",
        TenantSummaries,
        lambda summaries: summaries.note(tenant=tenant, kind=kind, state=state),
    )
