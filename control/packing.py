"""The packing of CPU cores and host memory for the tick's drain moves (read from rows).

The scheduling pass packs from its snapshot (``scheduler.packing.packing_for``); the
tick's drain moves bind before there is one, so what they pack by is read here: the
servers' capacities (the cluster's) and the active jobs' requests, in one query, asked
only when a drain moves something.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db.models import Q

from fabric.topology import FabricSpec
from jobs.agent_commands import runtime_job_name
from jobs.choices import ACTIVE_STATES
from jobs.models import Job
from scheduler.packing import Packing, PerGpu
from scheduler.types import ServerCapacity


def drain_packing(spec: FabricSpec, capacity: Mapping[int, ServerCapacity]) -> Packing | None:
    """What the drain moves' binding packs by: ``capacity`` (server id -> cores and memory,
    where known) and the request per GPU of every job holding GPUs; None when no
    server's capacity is known or no active job asks for CPU or memory."""
    bounded = {server: cap for server, cap in capacity.items() if cap.cpus or cap.mem_mib}
    if not bounded:
        return None
    asking = Job.objects.filter(state__in=ACTIVE_STATES).filter(
        Q(cpus_per_gpu__gt=0) | Q(mem_per_gpu_mib__gt=0)
    )
    requests = {
        runtime_job_name(pk): PerGpu(cpus, mem)
        for pk, cpus, mem in asking.values_list("pk", "cpus_per_gpu", "mem_per_gpu_mib")
    }
    if not requests:
        return None
    return Packing(bounded, requests, {g: spec.server_of(g) for g in range(spec.total_gpus)})
