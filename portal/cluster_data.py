"""The admin's cluster view as plain data: inventory with allocations, timeline, JCT.

Built with a fixed number of queries; the page loads it on open, after every
reconnect and (coalesced) after cluster events, which carry only ids.

Timeline: replayed from the jobs' events (every change of state or parallelism
is one), so it needs no sampling process:

    queue length(t)       jobs in state ``queued``
    GPUs in use(t)        sum of parallelism of running/scaling jobs
    efficiency(t)         sum over running jobs of thr(n)/thr(1), over all GPUs
                          (EDL's cluster efficiency; a job not yet profiled
                          counts as scaling perfectly, thr(n)/thr(1) = n)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from inventory.models import Gpu, Server
from inventory.services import current_spec
from jobs.choices import ACTIVE_STATES, JobState
from jobs.models import Job, JobCable, JobEvent
from jobs.stats import completed_jcts, summarize
from scheduler.curves import gpu_efficiency, speedup

WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "all": None}
DEFAULT_WINDOW = "24h"
TIMELINE_POINTS = 600


def _share(state: str | None, width: int, curve: Any) -> tuple[int, int, float]:
    """One job's part of the timeline's sums: (queued, GPUs in use, thr(n)/thr(1))."""
    if state in ACTIVE_STATES:
        return 0, width, speedup(curve, width)
    return (1 if state == JobState.QUEUED else 0), 0, 0.0


def timeline(since: datetime | None, now: datetime, total_gpus: int) -> dict[str, list[Any]]:
    """Queue length, GPUs in use and cluster efficiency over [since, now].

    The sums are kept as the events are replayed (each event moves one job's share),
    so the cost is linear in the events, not events x jobs.
    """
    relevant = Job.objects.all()
    if since is not None:
        relevant = relevant.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
    curves = dict(relevant.values_list("pk", "throughput_curve"))
    events = JobEvent.objects.filter(job__in=relevant.values("pk")).order_by("at", "id")
    state: dict[int, str] = {}
    width: dict[int, int] = {}
    shares: dict[int, tuple[int, int, float]] = {}
    queued, used, eff = 0, 0, 0.0
    series: dict[str, list[Any]] = {"t": [], "queue": [], "gpus_in_use": [], "efficiency": []}

    def emit(at: datetime) -> None:
        series["t"].append(at)
        series["queue"].append(queued)
        series["gpus_in_use"].append(used)
        series["efficiency"].append(eff)

    started = False
    for job_id, at, to_state, to_parallelism in events.values_list(
        "job_id", "at", "to_state", "to_parallelism"
    ):
        if since is not None and at >= since and not started:
            if state:  # the window opens on jobs already there; else start at the first event
                emit(since)
            started = True
        if to_state:
            state[job_id] = to_state
        if to_parallelism is not None:
            width[job_id] = to_parallelism
        old = shares.get(job_id, (0, 0, 0.0))
        new = _share(state.get(job_id), width.get(job_id, 0), curves.get(job_id))
        shares[job_id] = new
        queued += new[0] - old[0]
        used += new[1] - old[1]
        eff += new[2] - old[2]
        if since is None or at >= since:
            emit(at)
    if not started and since is not None:
        emit(since)
    emit(now)
    if len(series["t"]) > TIMELINE_POINTS:  # keep the payload small: even thinning
        step = len(series["t"]) / TIMELINE_POINTS
        keep = sorted({int(i * step) for i in range(TIMELINE_POINTS)} | {len(series["t"]) - 1})
        series = {k: [v[i] for i in keep] for k, v in series.items()}
    # Formatted once thinned: the replay itself keeps raw times and sums.
    series["t"] = [at.isoformat() for at in series["t"]]
    series["efficiency"] = [
        round(max(e, 0.0) / total_gpus, 4) if total_gpus else None for e in series["efficiency"]
    ]
    return series


def window_start(window: str, now: datetime) -> datetime | None:
    """The start of a named window (None = all time)."""
    seconds = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    return None if seconds is None else now - timedelta(seconds=seconds)


def cluster_snapshot(window: str = DEFAULT_WINDOW) -> dict[str, Any]:
    """Everything the cluster view draws; ``fabric`` is None before a topology is loaded."""
    now = timezone.now()
    since = window_start(window, now)
    jcts = sorted(completed_jcts(Job.objects.all(), since))
    queued = Job.objects.filter(state=JobState.QUEUED).count()
    base: dict[str, Any] = {
        "type": "cluster.snapshot",
        "window": window if window in WINDOWS else DEFAULT_WINDOW,
        "queue_length": queued,
        "jct": {**summarize(jcts).as_dict(), "values": jcts},
    }
    spec = current_spec()
    if spec is None:
        return {**base, "fabric": None}
    servers = [
        {"node": node, "leaf": leaf, "slot": slot, "state": st, "reason": reason}
        for node, leaf, slot, st, reason in Server.objects.values_list(
            "node", "leaf", "slot", "state", "state_reason"
        )
    ]
    gpus = list(
        Gpu.objects.order_by("index").values_list(
            "index", "server__leaf", "server__slot", "local", "assignment__job_id"
        )
    )
    cables = list(JobCable.objects.values_list("leaf", "port", "spine", "job_id"))
    holders = {g[4] for g in gpus if g[4] is not None} | {c[3] for c in cables}
    jobs = {
        str(pk): {
            "name": name,
            "tenant": tenant,
            "state": st,
            "parallelism": par,
            "gpu_efficiency": gpu_efficiency(curve, par, rate),
        }
        for pk, name, tenant, st, par, curve, rate in Job.objects.filter(
            pk__in=holders
        ).values_list(
            "pk",
            "name",
            "tenant__slug",
            "state",
            "parallelism",
            "throughput_curve",
            "samples_per_s",
        )
    }
    total = len(gpus)
    return {
        **base,
        "fabric": {**spec.to_dict(), "gpus_per_leaf": spec.gpus_per_leaf},
        "servers": servers,
        "gpus": gpus,
        "cables": cables,
        "jobs": jobs,
        "totals": {
            "gpus": total,
            "allocated": sum(1 for g in gpus if g[4] is not None),
            "down": sum(spec.gpus_per_server for s in servers if s["state"] != "up"),
            "cables_reserved": len(cables),
            "cables": spec.leaves * spec.gpus_per_leaf,
        },
        "timeline": timeline(since, now, total),
    }
