"""Fabric-aware placement: vClos (isolated sub-Clos per job) versus ECMP-shared.

Two placements over a ``fabric.topology.FabricSpec`` leaf-spine network:

* ``vclos``: a job gets an ``m x n`` sub-Clos from ``fabric.allocator.VClosAllocator``;
  its links are its own, so its communication never slows down, but it waits
  until such a shape is free.
* ``ecmp``: a job gets any free GPUs (the lowest ids, as a count scheduler
  would hand them out after churn); flows are hashed onto uplinks and the
  fabric's link-load analysis (``fabric.contention.ecmp_slowdown``) gives each
  running job a slowdown >= 1 of its communication time.

:func:`simulate_fabric` replays a trace with a strict FIFO queue (head-of-line
blocking, as in the vClos authors' runs) and rigid jobs; a job's progress rate
is ``iteration_time(n) / iteration_time(n, slowdown)`` from the throughput
model, so the slowdown touches only the communication part.
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from fabric.allocator import VClosAllocator
from fabric.contention import ecmp_slowdown
from fabric.errors import PlacementError
from fabric.topology import FabricSpec
from scheduler.policies.base import Policy
from scheduler.simulator import JobResult, SimResult, summarize
from scheduler.throughput import NetworkSpec, get_model, iteration_time, speedup_over_one
from scheduler.traces import TraceJob
from scheduler.types import Gpu, GpuState, Snapshot


class VClosPlacement:
    """The :class:`scheduler.placement.Placement` for ``schedule()`` on a vClos fabric.

    Built from a snapshot (its ``fabric_spec`` and running ``allocations``), it
    reserves an isolated sub-Clos per started job in a private
    ``VClosAllocator``; preemptions in the same round free theirs first.
    Growing a vClos job would change its shape, so grows are refused (the job
    keeps its size; ``Migrate`` to a bigger shape is future work).
    """

    name = "vclos"

    def __init__(
        self, spec: FabricSpec, allocations: Sequence[Any] = (), down: Sequence[int] = ()
    ) -> None:
        self.allocator = VClosAllocator(spec)
        self.allocator.restore(list(allocations))
        if down:
            self.allocator.set_unavailable(down)
        self.placed: dict[str, Any] = {}

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> VClosPlacement:
        """The placement for one ``schedule()`` call (the snapshot must carry a fabric_spec)."""
        cluster = snapshot.cluster
        if cluster.fabric_spec is None:
            raise ValueError("vClos placement needs the snapshot's fabric_spec")
        down = [g.id for g in cluster.gpus if g.state is GpuState.DOWN]
        return cls(cluster.fabric_spec, cluster.allocations, down)

    def place(
        self,
        n: int,
        free: Sequence[int],
        gpus: Mapping[int, Gpu],
        near: Sequence[int] = (),
        job: str = "",
    ) -> tuple[int, ...] | None:
        """An isolated m x n sub-Clos for a starting job, or None (also for grows)."""
        if near or n <= 0:
            return None
        key = job or f"pending-{len(self.placed)}"
        got = self.allocator.try_allocate(key, n)
        if isinstance(got, PlacementError):
            return None
        self.placed[key] = got
        return tuple(got.gpus)

    def release(self, job: str) -> None:
        """A preempted job's sub-Clos becomes free for this round's starts."""
        if job in self.allocator.allocations():
            self.allocator.release(job)


class _Run:
    __slots__ = ("gpus", "job", "last", "rate", "remaining", "start", "version")

    def __init__(self, job: TraceJob, gpus: tuple[int, ...], now: float) -> None:
        self.job = job
        self.gpus = gpus
        self.remaining = job.duration
        self.rate = 1.0
        self.last = now
        self.start = now
        self.version = 0

    def settle(self, now: float) -> None:
        self.remaining -= (now - self.last) * self.rate
        self.last = now


def fabric_spec_for(total_gpus: int, gpus_per_server: int, leaves: int) -> FabricSpec:
    """A full-bisection leaf-spine fabric with ``leaves`` leaves (spines = GPUs per leaf)."""
    servers = total_gpus // gpus_per_server
    if leaves <= 0 or servers % leaves:
        raise ValueError("servers must split evenly over the leaves")
    per_leaf = servers // leaves
    return FabricSpec(
        leaves=leaves,
        spines=per_leaf * gpus_per_server,
        servers_per_leaf=per_leaf,
        gpus_per_server=gpus_per_server,
    )


def simulate_fabric_trace(
    trace: Sequence[TraceJob],
    spec: FabricSpec,
    mode: str,
    *,
    pattern: str = "ring",
    seed: int = 0,
    sample_every: float = 60.0,
) -> SimResult:
    """FIFO with head-of-line blocking on a fabric, placement ``vclos`` or ``ecmp``."""
    if mode not in ("vclos", "ecmp"):
        raise ValueError(f"unknown fabric placement {mode!r}")
    total = spec.total_gpus
    net = NetworkSpec(
        gpus_per_server=spec.gpus_per_server, network_bytes_per_s=spec.link_gbps * 1e9 / 8
    )
    allocator = VClosAllocator(spec) if mode == "vclos" else None
    free: set[int] = set(range(total))
    queue: deque[TraceJob] = deque()
    running: dict[str, _Run] = {}
    comp: list[tuple[float, int, str, int]] = []
    seq = 0
    ai = 0
    first = trace[0].submit if trace else 0.0
    prev = first
    busy_area = 0.0
    eff_area = 0.0
    used = 0
    eff_sum = 0.0
    results: list[JobResult] = []
    series: dict[str, list[float]] = {
        "t": [],
        "busy": [],
        "efficiency": [],
        "queued": [],
        "running": [],
        "slowdown": [],
    }
    next_sample = first
    skipped = 0
    base_iter: dict[tuple[str, int], float] = {}

    def rate_for(job: TraceJob, n: int, slowdown: float) -> float:
        model = get_model(job.model or "resnet50")
        key = (model.name, n)
        ref = base_iter.get(key)
        if ref is None:
            ref = iteration_time(model, n, net)
            base_iter[key] = ref
        return ref / iteration_time(model, n, net, slowdown) if slowdown > 1.0 else 1.0

    def push(run: _Run) -> None:
        nonlocal seq
        run.version += 1
        seq += 1
        end = run.last + max(run.remaining, 0.0) / run.rate
        heapq.heappush(comp, (end, seq, run.job.id, run.version))

    def refresh_rates(now: float) -> float:
        if mode != "ecmp" or not running:
            return 1.0
        runs = [r for r in running.values() if len(r.gpus) > 1]
        if not runs:
            return 1.0
        slow = ecmp_slowdown(spec, [r.gpus for r in runs], pattern, seed)
        for r, s in zip(runs, slow, strict=True):
            new = rate_for(r.job, len(r.gpus), s)
            if new != r.rate:
                r.settle(now)
                r.rate = new
                push(r)
        return max(slow)

    n_jobs = len(trace)
    worst = 1.0
    while ai < n_jobs or comp:
        while comp and (comp[0][2] not in running or running[comp[0][2]].version != comp[0][3]):
            heapq.heappop(comp)
        t_comp = comp[0][0] if comp else math.inf
        t_arr = trace[ai].submit if ai < n_jobs else math.inf
        now = min(t_comp, t_arr)
        if now == math.inf:
            break
        busy_area += used * (now - prev)
        eff_area += eff_sum * (now - prev)
        prev = now
        changed = False
        while comp and comp[0][0] <= now:
            _, _, jid, version = heapq.heappop(comp)
            run = running.get(jid)
            if run is None or run.version != version:
                continue
            del running[jid]
            free.update(run.gpus)
            if allocator is not None:
                allocator.release(jid)
            used -= len(run.gpus)
            eff_sum -= speedup_over_one(
                run.job.model or "resnet50", len(run.gpus), spec.gpus_per_server
            )
            j = run.job
            results.append(
                JobResult(j.id, j.submit, run.start, now, j.gpus, j.duration, j.model, 0, 0)
            )
            changed = True
        while ai < n_jobs and trace[ai].submit <= now:
            job = trace[ai]
            ai += 1
            if job.gpus > total:
                skipped += 1
                continue
            queue.append(job)
        while queue:
            job = queue[0]
            gpus: tuple[int, ...] | None
            if allocator is not None:
                got = allocator.try_allocate(job.id, job.gpus)
                if isinstance(got, PlacementError):
                    if got.code == "too_large":
                        queue.popleft()
                        skipped += 1
                        continue
                    break
                gpus = tuple(got.gpus)
            else:
                if len(free) < job.gpus:
                    break
                gpus = tuple(sorted(free)[: job.gpus])
            queue.popleft()
            free.difference_update(gpus)
            run = _Run(job, gpus, now)
            running[job.id] = run
            used += len(gpus)
            eff_sum += speedup_over_one(job.model or "resnet50", len(gpus), spec.gpus_per_server)
            push(run)
            changed = True
        if changed:
            worst = refresh_rates(now)
        if now >= next_sample:
            series["t"].append(now)
            series["busy"].append(used)
            series["efficiency"].append(eff_sum)
            series["queued"].append(len(queue))
            series["running"].append(len(running))
            series["slowdown"].append(worst)
            next_sample = now + sample_every
    results.sort(key=lambda r: (r.submit, r.id))
    summary = summarize(
        results, total, busy_area, eff_area, first, prev, 0, 0, unfinished=n_jobs - len(results)
    )
    summary["policy"] = f"fifo+{mode}"
    summary["skipped"] = skipped
    slow = series["slowdown"]
    summary["mean_max_slowdown"] = round(statistics.fmean(slow), 4) if slow else 1.0
    return SimResult(f"fifo+{mode}", tuple(results), series, summary)


def simulate_fabric(
    trace: Sequence[TraceJob], policy: Policy, args: argparse.Namespace, total: int
) -> SimResult:
    """CLI adapter: vClos/ECMP placement runs the FIFO queue of the vClos paper."""
    if policy.name != "fifo":
        raise ValueError(
            "--placement vclos/ecmp runs the vClos paper's FIFO queue: use --policy fifo"
        )
    spec = fabric_spec_for(total, args.gpus_per_server, args.leaves)
    extra: dict[str, Any] = {"seed": args.seed, "sample_every": args.sample_every}
    return simulate_fabric_trace(trace, spec, args.placement, **extra)
