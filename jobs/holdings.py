"""What a job holds: its GPUs (with ranks) and reserved cables, and its vClos allocation.

The single writer of ``JobGpu``/``JobCable`` rows and of ``Job.allocation``:
both always describe the same placement, so nothing else may change either.
The database's uniqueness constraints forbid double booking a GPU or a cable.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence

from django.db import connection

from fabric.allocator import Allocation
from fabric.topology import FabricSpec
from inventory.models import Gpu
from jobs.agent_commands import GpuHome, worker_id
from jobs.models import Job, JobCable, JobGpu


def held_gpus(job: Job) -> tuple[int, ...]:
    """The GPU indices ``job`` holds, in rank order."""
    return tuple(
        JobGpu.objects.filter(job=job).order_by("rank").values_list("gpu__index", flat=True)
    )


def gpu_homes(indices: Iterable[int]) -> dict[int, GpuHome]:
    """Where each GPU lives: its server's agent node, local device index and address.

    The address is the one its agent's heartbeats give (loopback until one has).
    """
    rows = Gpu.objects.filter(index__in=list(indices)).values_list(
        "index", "server__node", "local", "server__agent_info__address"
    )
    return {
        index: GpuHome(node=node, local=local, address=address or "127.0.0.1")
        for index, node, local, address in rows
    }


def store(job: Job, allocation: Allocation | None, spec: FabricSpec | None) -> None:
    """Make ``job`` hold exactly ``allocation`` (nothing when None): rows and JSON together.

    The rows are written here; ``job.allocation`` is set here and persisted by
    the caller with the rest of the job it is changing anyway (a
    ``lifecycle.transition`` saves the whole job, else ``lifecycle.save_fields``),
    so a tick writes each changed job once.
    """
    if job.allocation or job.parallelism:  # a job that holds nothing has no rows
        JobGpu.objects.filter(job=job).delete()
        JobCable.objects.filter(job=job).delete()
    job.allocation = allocation.to_dict() if allocation is not None else {}
    if allocation is None or spec is None:
        return
    gpu_rows = dict(Gpu.objects.filter(index__in=allocation.gpus).values_list("index", "id"))
    JobGpu.objects.bulk_create(
        JobGpu(job=job, gpu_id=gpu_rows[g], rank=rank) for rank, g in enumerate(allocation.gpus)
    )
    JobCable.objects.bulk_create(
        JobCable(job=job, leaf=leaf, port=port, spine=spec.spine_of_uplink(port))
        for leaf, port in allocation.cables()
    )


def store_many(changes: Sequence[tuple[Job, Allocation | None]], spec: FabricSpec) -> None:
    """:func:`store` for many jobs at once: one delete and one insert per table.

    Every old row goes before any new one is written, so GPUs and cables may
    pass from one of these jobs to another.  As with :func:`store`, each
    ``job.allocation`` is set here and saved by the caller.  On PostgreSQL the
    four statements go in one round trip (:func:`_store_rows`).
    """
    holding = [job.pk for job, _ in changes if job.allocation or job.parallelism]
    gpus: list[tuple[int, int, int]] = []  # (job, GPU index, rank)
    cables: list[tuple[int, int, int, int]] = []  # (job, leaf, port, spine)
    for job, allocation in changes:
        job.allocation = allocation.to_dict() if allocation is not None else {}
        if allocation is None:
            continue
        gpus.extend((job.pk, gpu, rank) for rank, gpu in enumerate(allocation.gpus))
        cables.extend(
            (job.pk, leaf, port, spec.spine_of_uplink(port)) for leaf, port in allocation.cables()
        )
    if connection.vendor == "postgresql":
        _store_rows(holding, gpus, cables)
        return
    if holding:
        JobGpu.objects.filter(job_id__in=holding).delete()
        JobCable.objects.filter(job_id__in=holding).delete()
    if not gpus:
        return
    ids = dict(Gpu.objects.filter(index__in={g for _, g, _ in gpus}).values_list("index", "id"))
    JobGpu.objects.bulk_create(
        [JobGpu(job_id=job, gpu_id=ids[gpu], rank=rank) for job, gpu, rank in gpus],
        batch_size=5000,
    )
    JobCable.objects.bulk_create(
        [JobCable(job_id=j, leaf=leaf, port=port, spine=spine) for j, leaf, port, spine in cables],
        batch_size=5000,
    )


def _store_rows(
    holding: Sequence[int],
    gpus: Sequence[tuple[int, int, int]],
    cables: Sequence[tuple[int, int, int, int]],
) -> None:
    """The holdings' deletes and inserts as one round trip of four statements (PostgreSQL).

    The rows go as JSON documents.  A GPU index with no GPU row finds no id,
    and the ``NOT NULL`` of ``gpu_id`` fails the statement: nothing is stored.
    """
    quote = connection.ops.quote_name
    job_gpu, job_cable, gpu = (quote(model._meta.db_table) for model in (JobGpu, JobCable, Gpu))
    sql = f"""
        DELETE FROM {job_gpu} WHERE job_id = ANY(%s);
        DELETE FROM {job_cable} WHERE job_id = ANY(%s);
        INSERT INTO {job_gpu} (job_id, gpu_id, rank)
            SELECT v.job, (SELECT g.id FROM {gpu} g WHERE g."index" = v.gpu), v.rank
            FROM jsonb_to_recordset(%s::jsonb) AS v(job bigint, gpu integer, rank integer);
        INSERT INTO {job_cable} (job_id, leaf, port, spine)
            SELECT v.job, v.leaf, v.port, v.spine
            FROM jsonb_to_recordset(%s::jsonb) AS v(job bigint, leaf integer, port integer, spine integer)
    """
    jobs = list(holding)
    gpu_rows = json.dumps([{"job": j, "gpu": g, "rank": r} for j, g, r in gpus])
    cable_rows = json.dumps(
        [{"job": j, "leaf": lf, "port": p, "spine": s} for j, lf, p, s in cables]
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, (jobs, jobs, gpu_rows, cable_rows))


def release(job: Job) -> tuple[int, ...]:
    """Free every GPU and cable ``job`` holds; return the GPUs it held, in rank order."""
    held = held_gpus(job)
    if held:
        store(job, None, None)
        job.save(update_fields=["allocation"])
    return held


def keep_only_workers(job: Job, workers: set[str]) -> tuple[str, ...]:
    """Release the GPUs of workers that are no longer members; return their worker ids.

    Nothing changes when every worker or none would go (the runtime's report
    then describes a job that is leaving or untouched, not a shrink).
    """
    rows = list(JobGpu.objects.filter(job=job).select_related("gpu").order_by("rank"))
    gone = [row for row in rows if worker_id(row.gpu.index) not in workers]
    if not gone or len(gone) == len(rows):
        return ()
    JobGpu.objects.filter(pk__in=[row.pk for row in gone]).delete()
    kept = [row.gpu.index for row in rows if row not in gone]
    if job.allocation:
        # A subset of a vClos keeps its reserved cables, still contention-free.
        job.allocation = {**job.allocation, "gpus": kept}
        job.save(update_fields=["allocation"])
    return tuple(worker_id(row.gpu.index) for row in gone)


def drop_workers(job: Job, dead: Collection[str]) -> tuple[str, ...]:
    """Release the GPUs of the ``dead`` workers ``job`` holds; return their worker ids.

    For workers the runtime dropped for good: the rest keep their ranks and
    cables.  Ids ``job`` does not hold (another job's, a leaver already gone,
    nonsense) are ignored, and nothing changes when every worker would go: a
    job with no survivor is the reconciler's to requeue, not a shrink.
    """
    held = {worker_id(index) for index in held_gpus(job)}
    if not held & set(dead):
        return ()
    return keep_only_workers(job, held - set(dead))
