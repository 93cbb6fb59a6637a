"""The admin's cluster view as plain data: inventory with allocations, timeline, JCT.

Built with a fixed number of queries; the page loads it on open, after every
reconnect, after a seq gap and when the topology itself changed.  Otherwise it
patches this data from the cluster group's events (each job's GPUs, cables and
efficiency, the queue length, a server's state: ``jobs.live.patches``), and
the snapshot carries the ``seq`` it reflects, read before its queries.

Timeline: replayed from the jobs' events and kept between requests
(``portal.cluster_timeline``), with the share in use per GPU type.  The
tables under the charts (types, pools, pending servers, servers' health) are
drawn from this data too: types and pools follow each job's patch; pending
servers come with the snapshot reloaded on ``topology.changed``.  The servers'
health table is not in it (a GPU's NVML figures would make it several times
larger): the page reads ``GET /api/v1/servers/`` after each reload, as on
``server.health`` and ``gpu.suspect``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from inventory.listing import pending_rows
from inventory.models import Gpu, Server
from inventory.registration import health_word
from inventory.server_types import pool_of
from inventory.services import current_spec, suspect_gpus
from jobs.choices import JobState
from jobs.models import Job, JobCable
from jobs.stats import completed_jcts, summarize
from portal.cluster_timeline import timeline
from scheduler.curves import gpu_efficiency, speedup
from tenancy.models import Tenant
from utilities.realtime import CLUSTER_GROUP, current_seq

WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "all": None}
DEFAULT_WINDOW = "24h"


def window_start(window: str, now: datetime) -> datetime | None:
    """The start of a named window (None = all time)."""
    seconds = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    return None if seconds is None else now - timedelta(seconds=seconds)


TYPE_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d")
"""Colours of GPU types (servers in the topology drawing and the editor), in type order."""


def type_colours(types: Iterable[str]) -> dict[str, str]:
    """A colour per GPU type: the types sorted, the palette in turn (the same on every page)."""
    ordered = sorted(set(types))
    return {t: TYPE_PALETTE[i % len(TYPE_PALETTE)] for i, t in enumerate(ordered)}


def types_in_use(gpus: list[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    """Per GPU type: its GPUs and how many a job holds (the gpus' last two columns)."""
    out: dict[str, dict[str, int]] = {}
    for row in gpus:
        entry = out.setdefault(row[5], {"gpus": 0, "allocated": 0})
        entry["gpus"] += 1
        entry["allocated"] += row[4] is not None
    return out


def pools_in_use(
    servers: list[dict[str, Any]], gpus: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """Per pool (a server's ``pool`` label, "" for none): servers, GPUs, held, GPU types."""
    pool_at = {(s["leaf"], s["slot"]): s["pool"] for s in servers}
    out: dict[str, dict[str, Any]] = {}
    for s in servers:
        entry = out.setdefault(s["pool"], {"pool": s["pool"], "servers": 0, "types": set()})
        entry["servers"] += 1
        entry["types"].add(s["gpu_type"])
    counts = {pool: [0, 0] for pool in out}
    for row in gpus:
        pool = pool_at.get((row[1], row[2]))
        if pool is not None:
            counts[pool][0] += 1
            counts[pool][1] += row[4] is not None
    return [
        {**entry, "types": sorted(entry["types"]), "gpus": counts[p][0], "allocated": counts[p][1]}
        for p, entry in sorted(out.items())
    ]


def cluster_snapshot(window: str = DEFAULT_WINDOW) -> dict[str, Any]:
    """Everything the cluster view draws; ``fabric`` is None before a topology is loaded."""
    seq = current_seq(CLUSTER_GROUP)
    now = timezone.now()
    since = window_start(window, now)
    jcts = sorted(completed_jcts(Job.objects.all(), since))
    queued = Job.objects.filter(state=JobState.QUEUED).count()
    base: dict[str, Any] = {
        "type": "cluster.snapshot",
        "seq": seq,
        "window": window if window in WINDOWS else DEFAULT_WINDOW,
        "queue_length": queued,
        "jct": {**summarize(jcts).as_dict(), "values": jcts},
        # Events name a job's tenant by id; the legend shows its slug.
        "tenants": {str(pk): slug for pk, slug in Tenant.objects.values_list("pk", "slug")},
        # Servers that reported themselves and wait for an admin (accept or forget).
        "pending": pending_rows(),
    }
    spec = current_spec()
    if spec is None:
        return {**base, "fabric": None}
    # A server's type and pool, and its health in a word ("not reported" without NVML).
    servers = [
        {"node": node, "leaf": leaf, "slot": slot, "state": st, "reason": reason}
        | {"gpu_type": gpu_type, "pool": pool_of(labels), "health": health_word(hardware)}
        for node, leaf, slot, st, reason, gpu_type, labels, hardware in Server.objects.values_list(
            "node",
            "leaf",
            "slot",
            "state",
            "state_reason",
            "gpu_type",
            "labels",
            "agent_info__hardware",
        )
    ]
    # index, leaf, slot, local, holding job, GPU type
    gpus = list(
        Gpu.objects.order_by("index").values_list(
            "index",
            "server__leaf",
            "server__slot",
            "local",
            "assignment__job_id",
            "server__gpu_type",
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
            "speedup": round(speedup(curve, par), 4) if par else 0.0,
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
    types = types_in_use(gpus)
    return {
        **base,
        "fabric": {**spec.to_dict(), "gpus_per_leaf": spec.gpus_per_leaf},
        "servers": servers,
        "gpus": gpus,
        "cables": cables,
        "jobs": jobs,
        # GPUs in a straggler's cool-down (no new placement lands there): index, until, why.
        "suspect": [mark.as_dict() for mark in suspect_gpus()],
        "types": types,
        "type_colours": type_colours(str(s["gpu_type"]) for s in servers),
        "pools": pools_in_use(servers, gpus),
        "totals": {
            "gpus": total,
            "allocated": sum(1 for g in gpus if g[4] is not None),
            "down": sum(spec.gpus_per_server for s in servers if s["state"] != "up"),
            "cables_reserved": len(cables),
            "cables": spec.leaves * spec.gpus_per_leaf,
        },
        "timeline": timeline(
            base["window"], since, now, total, {t: v["gpus"] for t, v in types.items()}
        ),
    }
