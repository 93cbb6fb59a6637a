"""A mixed cluster in the simulator: one loop per GPU type, jobs given a type each.

A trace names no GPU types, so the replay assigns them (:func:`assign_types`: a
seeded mix, e.g. three quarters A100 and a quarter H100, or a job -> type map a
trace's column gives).  A job never straddles types and stays on its type, so a
cluster of pools with every job typed is exactly one independent cluster per
type: :func:`simulate_mixed` runs :func:`scheduler.simulator.simulate` once per
pool, with the pool's GPUs and speed (``SimConfig.gpu_speed``: durations and
curves of the faster type, :mod:`scheduler.throughput`) and the jobs of that
type::

    trace ──assign_types(seeded mix)──┬─ jobs of a100 ─ simulate(a100 pool, speed 1.0) ─┐
                                      └─ jobs of h100 ─ simulate(h100 pool, speed 2.0) ─┴─> per-type
                                                                                            and overall
                                                                                            figures

What this leaves out, said where it matters: placement is by count (the vClos
binder's typed binding, :func:`scheduler.binding.bind_typed`, is tested on its own,
not replayed here); a job that accepts several types is routed once, at arrival (the live pass routes it at each pass until it starts,
:mod:`scheduler.gpu_types`), and tenants' fair share and quotas are per pool: a tenant's
quota of one type (``type_quota``, the live tick's per-type quota) bounds it in that
type's pool, beside its total (``SimConfig.quota``), which bounds each pool on its own
(:func:`pool_quota`; the live tick bounds the sum over types too).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.gpu_types import parse_type_numbers
from scheduler.policies.base import Policy
from scheduler.sim_accounting import SimResult
from scheduler.sim_config import SimConfig
from scheduler.simulator import simulate
from scheduler.traces import TraceJob


@dataclass(frozen=True, slots=True)
class TypePool:
    """One type's GPUs in a mixed cluster and its speed against the reference type."""

    name: str
    gpus: int
    speed: float = 1.0


def parse_pools(cluster_types: str, speeds: str = "") -> tuple[TypePool, ...]:
    """``"a100:48,h100:16"`` (GPUs per type) and ``"h100:2"`` (speed per type, 1.0 unless
    named) -> the pools; ValueError (one line) naming the option on bad input."""
    counts = parse_type_numbers(cluster_types, "cluster types")
    factors = parse_type_numbers(speeds, "gpu speeds") if speeds.strip() else {}
    for name, gpus in counts.items():
        if gpus != int(gpus) or gpus < 1:
            raise ValueError(f"cluster types {name}:{gpus:g} must be a whole number of GPUs >= 1")
    for name, speed in factors.items():
        if name not in counts or not speed > 0:
            raise ValueError(f"gpu speeds {name}:{speed:g} must name a cluster type, speed > 0")
    return tuple(TypePool(n, int(g), factors.get(n, 1.0)) for n, g in counts.items())


def assign_types(trace: Sequence[TraceJob], mix: Mapping[str, float], seed: int) -> dict[str, str]:
    """Job id -> GPU type: the trace's own (``TraceJob.gpu_type``, a column) where it gives
    one, else drawn from ``mix`` (type -> share; shares need not sum to 1) by a seeded RNG:
    the same trace, mix and seed give the same types.  An empty ``mix`` draws nothing (every
    job must then have its own type)."""
    if mix and (not all(share >= 0 for share in mix.values()) or sum(mix.values()) <= 0):
        raise ValueError("gpu mix needs shares >= 0 that add up to more than 0")
    rng = random.Random(seed)
    names, weights = list(mix), list(mix.values())
    types: dict[str, str] = {}
    for job in trace:
        if job.gpu_type:
            types[job.id] = job.gpu_type
        elif not mix:
            raise ValueError(f"job {job.id} has no gpu_type and no gpu mix was given")
        else:
            types[job.id] = rng.choices(names, weights)[0]
    return types


@dataclass(frozen=True, slots=True)
class MixedResult:
    """Each pool's simulation, by type, in the pools' order."""

    by_type: Mapping[str, SimResult]
    pools: tuple[TypePool, ...]

    def summary(self) -> dict[str, Any]:
        """Per type: jobs, average and p95 JCT, GPU utilization; overall: jobs, average JCT
        (over every job), utilization (GPU-weighted over the pools)."""
        per_type: dict[str, Any] = {}
        jcts: list[float] = []
        for pool in self.pools:
            result = self.by_type[pool.name]
            s = result.summary
            per_type[pool.name] = {
                "gpus": pool.gpus, "speed": pool.speed, "jobs": s["jobs"],
                "avg_jct": s["avg_jct"], "p95_jct": s["p95_jct"],
                "gpu_utilization": s["gpu_utilization"], "skipped": s.get("skipped", 0),
            }  # fmt: skip
            jcts.extend(job.jct for job in result.jobs)
        total = sum(p.gpus for p in self.pools)
        util = sum(per_type[p.name]["gpu_utilization"] * p.gpus for p in self.pools) / total
        return {
            "by_type": per_type,
            "jobs": len(jcts),
            "avg_jct": round(statistics.fmean(jcts), 4) if jcts else 0.0,
            "gpu_utilization": round(util, 6),
        }


def pool_quota(
    total: Mapping[str, int] | None,
    type_quota: Mapping[str, Mapping[str, int]] | None,
    gpu_type: str,
) -> dict[str, int] | None:
    """Each tenant's quota in the pool of ``gpu_type``: the lesser of its total and its quota
    of that type, where it has either (None: no tenant has any, no quota rule)."""
    quota = dict(total or {})
    for tenant, per_type in (type_quota or {}).items():
        if gpu_type in per_type:
            limit = per_type[gpu_type]
            quota[tenant] = min(quota.get(tenant, limit), limit)
    return quota if total is not None or quota else None


def simulate_mixed(
    trace: Sequence[TraceJob],
    policy_for: Callable[[], Policy],
    cfg: SimConfig,
    pools: Sequence[TypePool],
    job_types: Mapping[str, str],
    type_quota: Mapping[str, Mapping[str, int]] | None = None,
) -> MixedResult:
    """Replay ``trace`` on a cluster of ``pools``, each job on the pool of its type
    (``job_types``; a job of a type no pool has is a ValueError).

    ``policy_for``: a callable giving a fresh :class:`Policy` per pool (a core keeps
    state); ``cfg`` is every pool's but for ``total_gpus``, ``gpu_speed`` and ``quota``:
    ``type_quota`` (tenant -> GPU type -> GPUs) bounds each tenant in each type's pool
    beside ``cfg.quota`` (:func:`pool_quota`); None: ``cfg.quota`` in every pool.
    """
    if cfg.placement != "count":  # one fabric per pool is not what a mixed fabric is
        raise ValueError(
            f"a mixed cluster replays by count, not --placement {cfg.placement} "
            "(vClos within a type: scheduler.binding.bind_typed)"
        )
    names = {p.name for p in pools}
    strays = sorted({t for t in job_types.values() if t not in names})
    if strays:
        raise ValueError(f"jobs of types no pool has: {', '.join(strays)}")
    by_type: dict[str, SimResult] = {}
    for pool in pools:
        jobs = [job for job in trace if job_types[job.id] == pool.name]
        pool_cfg = dataclasses.replace(cfg, total_gpus=pool.gpus, gpu_speed=pool.speed)
        if type_quota:
            pool_cfg = dataclasses.replace(
                pool_cfg, quota=pool_quota(cfg.quota, type_quota, pool.name)
            )
        by_type[pool.name] = simulate(jobs, policy_for(), pool_cfg)
    return MixedResult(by_type, tuple(pools))
