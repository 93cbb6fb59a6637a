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


CompiledStep = tuple[tuple[tuple[tuple[int, ...], float], ...], float, float]


@lru_cache(maxsize=8192)
def _compile_job(
    spec: FabricSpec, gpus: tuple[int, ...], pattern: str, seed: int
) -> tuple[tuple[CompiledStep, ...], tuple[int, ...]]:
    """A job's distinct steps under ECMP, and which of them each step is.

    A compiled step is (cross-leaf flows as (leaf-spine links, bytes), the largest
    intra-leaf flow's bytes, the largest flow's bytes). NIC links are left out:
    in every pattern a GPU sends and receives at most one flow per step, and a
    GPU belongs to one job, so they are never shared. Cached per job, so the
    simulator's repeated calls only redo the combination.
    """
    router = _ecmp_router(spec, seed)
    gpl = spec.gpus_per_leaf
    fabric_from = 2 * spec.total_gpus  # link ids below this are NIC links
    compiled: list[CompiledStep] = []
    ids: dict[int, int] = {}  # identical steps (ring repeats one flow set) compile once
    order = []
    for step in pattern_steps(pattern, gpus, 1.0, _group_size(spec, gpus)):
        sid = ids.get(id(step.flows))
        if sid is None:
            cross: list[tuple[tuple[int, ...], float]] = []
            local = 0.0
            ideal = 0.0
            for f in step.flows:
                ideal = max(ideal, f.nbytes)
                if f.src // gpl == f.dst // gpl:
                    local = max(local, f.nbytes)
                else:
                    path = router.path(f.src, f.dst)
                    cross.append((tuple(link for link in path if link >= fabric_from), f.nbytes))
            sid = len(compiled)
            compiled.append((tuple(cross), local, ideal))
            ids[id(step.flows)] = sid
        order.append(sid)
    return tuple(compiled), tuple(order)


@lru_cache(maxsize=4096)
def _ecmp_slowdown_cached(
    spec: FabricSpec, jobs: tuple[tuple[int, ...], ...], pattern: str, seed: int
) -> tuple[float, ...]:
    per_job = [_compile_job(spec, gpus, pattern, seed) for gpus in jobs]
    # Global step ids: (job index, compiled id) flattened.
    compiled: list[CompiledStep] = []
    schedule: list[list[int]] = []
    for steps, order in per_job:
        base = len(compiled)
        compiled.extend(steps)
        schedule.append([base + sid for sid in order])
    longest = max((len(s) for s in schedule), default=0)
    times = [0.0] * len(jobs)
    ideals = [0.0] * len(jobs)
    seen: dict[tuple[int, ...], list[float]] = {}
    for t in range(longest):
        # Step t of every job runs at the same time; shorter jobs repeat their steps
        # (training iterates). Identical combinations are computed once.
        key = tuple(s[t % len(s)] if s else -1 for s in schedule)
        hit = seen.get(key)
        if hit is None:
            counts: Counter[int] = Counter()
            for sid in key:
                if sid >= 0:
                    for links, _ in compiled[sid][0]:
                        counts.update(links)
            hot = {link for link, c in counts.items() if c > 1}
            jt = [compiled[sid][1] if sid >= 0 else 0.0 for sid in key]
            shared: list[tuple[int, float]] = []
            shared_paths: list[tuple[int, ...]] = []
            for j, sid in enumerate(key):
                if sid < 0:
                    continue
                for links, nbytes in compiled[sid][0]:
                    on_hot = tuple(link for link in links if link in hot)
                    if on_hot:
                        shared.append((j, nbytes))
                        shared_paths.append(on_hot)
                    elif nbytes > jt[j]:
                        jt[j] = nbytes
            # Links that carry one flow never limit it below the full rate, so the
            # max-min computation only needs the shared links.
            for (j, nbytes), rate in zip(shared, max_min_rates(shared_paths), strict=True):
                jt[j] = max(jt[j], nbytes / rate)
            hit = jt
            seen[key] = hit
        for j, sid in enumerate(key):
            if sid >= 0:
                times[j] += hit[j]
                ideals[j] += compiled[sid][2]
    return tuple(tm / i if i > 0 else 1.0 for tm, i in zip(times, ideals, strict=True))


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
