"""Link-load analysis: flows per directed link per step, and the max-min fair slowdown.

Every link (NIC or leaf-spine) has the same capacity, the fabric's
``link_gbps``; rates below are in units of that capacity. A step's flows get
max-min fair rates (progressive filling); a step lasts as long as its slowest
flow (``nbytes / rate``). The slowdown of a sequence of steps is its total time
divided by the time it would take if every flow had a link to itself
(``max nbytes`` per step): 1.0 means contention-free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from fabric.routing import EcmpRouting, Path, Router
from fabric.topology import FabricSpec
from fabric.traffic import Flow, Step, pattern_steps


@dataclass(frozen=True)
class StepLoad:
    """Load of one step: flows per directed link (only links that carry any)."""

    index: int
    label: str
    flows_per_link: Mapping[int, int]
    contended: tuple[int, ...]
    max_flows: int
    time: float
    ideal_time: float

    @property
    def slowdown(self) -> float:
        """This step's time over its contention-free time."""
        return self.time / self.ideal_time if self.ideal_time > 0 else 1.0


@dataclass(frozen=True)
class LoadReport:
    """Per-step loads and totals for a sequence of steps."""

    steps: tuple[StepLoad, ...]

    @property
    def max_flows(self) -> int:
        """Most flows on any directed link in any step (0 with no flows)."""
        return max((s.max_flows for s in self.steps), default=0)

    @property
    def contended_steps(self) -> int:
        """Steps with at least one link carrying two or more flows."""
        return sum(1 for s in self.steps if s.contended)

    @property
    def any_contention(self) -> bool:
        """Whether any step shares a link."""
        return self.contended_steps > 0

    @property
    def slowdown(self) -> float:
        """Total time over contention-free time (1.0 = no contention)."""
        ideal = sum(s.ideal_time for s in self.steps)
        return sum(s.time for s in self.steps) / ideal if ideal > 0 else 1.0


def max_min_rates(paths: Sequence[Path]) -> list[float]:
    """Max-min fair rates of flows on unit-capacity links (progressive filling)."""
    rates = [0.0] * len(paths)
    on_link: dict[int, list[int]] = {}
    for i, path in enumerate(paths):
        for link in path:
            on_link.setdefault(link, []).append(i)
    residual = dict.fromkeys(on_link, 1.0)
    active = dict.fromkeys(on_link, 0)
    for link, fl in on_link.items():
        active[link] = len(fl)
    frozen = [False] * len(paths)
    left = len(paths)
    while left:
        share = min(residual[link] / active[link] for link in on_link if active[link])
        tight = [
            link
            for link in on_link
            if active[link] and residual[link] / active[link] <= share * (1 + 1e-12)
        ]
        for link in tight:
            for i in on_link[link]:
                if frozen[i]:
                    continue
                frozen[i] = True
                left -= 1
                rates[i] = share
                for other in paths[i]:
                    residual[other] -= share
                    active[other] -= 1
    return rates


def step_load(index: int, step: Step, router: Router) -> StepLoad:
    """Load of one step under ``router``."""
    paths = [router.path(f.src, f.dst) for f in step.flows]
    counts: Counter[int] = Counter()
    for path in paths:
        counts.update(path)
    contended = tuple(sorted(link for link, c in counts.items() if c > 1))
    biggest = max(counts.values(), default=0)
    ideal = max((f.nbytes for f in step.flows), default=0.0)
    if not contended:
        time = ideal
    else:
        rates = max_min_rates(paths)
        time = max(f.nbytes / r for f, r in zip(step.flows, rates, strict=True))
    return StepLoad(
        index, step.label, MappingProxyType(dict(counts)), contended, biggest, time, ideal
    )


def analyze(spec: FabricSpec, steps: Sequence[Step], router: Router) -> LoadReport:
    """Per-step flows per directed link, contended links and max-min slowdown."""
    if router.spec != spec:
        raise ValueError("the router was built for another fabric")
    cache: dict[tuple[Flow, ...], StepLoad] = {}
    out = []
    for i, step in enumerate(steps):
        hit = cache.get(step.flows)
        if hit is None:
            hit = step_load(i, step, router)
            cache[step.flows] = hit
        out.append(
            StepLoad(
                i,
                step.label,
                hit.flows_per_link,
                hit.contended,
                hit.max_flows,
                hit.time,
                hit.ideal_time,
            )
        )
    return LoadReport(tuple(out))


@lru_cache(maxsize=64)
def _ecmp_router(spec: FabricSpec, seed: int) -> EcmpRouting:
    return EcmpRouting(spec, seed=seed)


@lru_cache(maxsize=4096)
def _ecmp_slowdown_cached(
    spec: FabricSpec, jobs: tuple[tuple[int, ...], ...], pattern: str, seed: int
) -> tuple[float, ...]:
    router = _ecmp_router(spec, seed)
    per_job = [pattern_steps(pattern, gpus, 1.0, _group_size(spec, gpus)) for gpus in jobs]
    longest = max((len(s) for s in per_job), default=0)
    times = [0.0] * len(jobs)
    ideals = [0.0] * len(jobs)
    seen: dict[tuple[int, ...], tuple[list[float], list[float]]] = {}
    for t in range(longest):
        # Step t of every job runs at the same time; shorter jobs repeat their steps
        # (training iterates). Identical combinations are computed once.
        idx = tuple(t % len(s) if s else -1 for s in per_job)
        key = tuple(id(per_job[j][i].flows) if i >= 0 else -1 for j, i in enumerate(idx))
        hit = seen.get(key)
        if hit is None:
            flows: list[Flow] = []
            owner: list[int] = []
            for j, i in enumerate(idx):
                if i >= 0:
                    for f in per_job[j][i].flows:
                        flows.append(f)
                        owner.append(j)
            paths = [router.path(f.src, f.dst) for f in flows]
            counts: Counter[int] = Counter()
            for p in paths:
                counts.update(p)
            if any(c > 1 for c in counts.values()):
                rates = max_min_rates(paths)
            else:
                rates = [1.0] * len(paths)
            jt = [0.0] * len(jobs)
            ji = [0.0] * len(jobs)
            for f, r, j in zip(flows, rates, owner, strict=True):
                jt[j] = max(jt[j], f.nbytes / r)
                ji[j] = max(ji[j], f.nbytes)
            hit = (jt, ji)
            seen[key] = hit
        for j in range(len(jobs)):
            times[j] += hit[0][j]
            ideals[j] += hit[1][j]
    return tuple(t / i if i > 0 else 1.0 for t, i in zip(times, ideals, strict=True))


def _group_size(spec: FabricSpec, gpus: Sequence[int]) -> int:
    """GPUs per leaf of a job when every leaf holds the same number, else all of them."""
    per_leaf = Counter(spec.leaf_of(g) for g in gpus)
    sizes = set(per_leaf.values())
    return sizes.pop() if len(sizes) == 1 else len(gpus)


def ecmp_slowdown(
    spec: FabricSpec, jobs_gpu_lists: Sequence[Sequence[int]], pattern: str = "ring", seed: int = 0
) -> tuple[float, ...]:
    """Communication slowdown of each job when all of them run ``pattern`` under ECMP.

    ``jobs_gpu_lists[j]`` is job ``j``'s GPUs in rank order. Step ``t`` of every
    job runs concurrently with step ``t`` of the others (a job with fewer steps
    repeats its sequence while the longest runs). Returns one factor ``>= 1`` per
    job, in input order (``max(...)`` for the worst job). Memoised on its
    arguments, so the simulator can call it in its inner loop.
    """
    jobs = tuple(tuple(int(g) for g in gpus) for gpus in jobs_gpu_lists)
    for gpus in jobs:
        for g in gpus:
            spec.check_gpu(g)
    return _ecmp_slowdown_cached(spec, jobs, pattern, seed)
