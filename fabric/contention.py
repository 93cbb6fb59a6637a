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
from fabric.traffic import PATTERNS, Flow, Step, pattern_steps


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


#: A compiled step: (cross-leaf flows as (leaf-spine links, bytes), largest
#: intra-leaf flow's bytes, largest flow's bytes).
CompiledStep = tuple[tuple[tuple[tuple[int, ...], float], ...], float, float]

MAX_DISTINCT_STEPS = 32
"""Most distinct steps of one job the ECMP analysis looks at (all-to-all has ``N-1``).

A pattern with more (only all-to-all of more than 33 ranks) is represented by
this many of its steps, evenly spaced: every all-to-all step moves the same
bytes, so the job's slowdown is estimated from a sample of its shifts.
"""

MAX_ALIGNED_STEPS = 64
"""Most aligned time steps per group of interacting jobs (see :func:`ecmp_slowdown`)."""


@dataclass(frozen=True)
class CompiledJob:
    """A job's distinct steps under ECMP, its schedule over them, and its fabric links.

    ``schedule`` is the job's shortest repeating sequence of step ids (a ring
    is one step repeated, so its schedule is that one step).
    """

    steps: tuple[CompiledStep, ...]
    schedule: tuple[int, ...]
    links: frozenset[int]


def _period(order: Sequence[int]) -> tuple[int, ...]:
    """The shortest prefix whose repetition is ``order`` (the whole of it if none)."""
    n = len(order)
    for p in range(1, n + 1):
        if n % p == 0 and all(order[i] == order[i % p] for i in range(n)):
            return tuple(order[:p])
    return tuple(order)


@lru_cache(maxsize=2048)
def _compile_job(spec: FabricSpec, gpus: tuple[int, ...], pattern: str, seed: int) -> CompiledJob:
    """A job's steps under ECMP (cached per job, so the simulator only redoes combinations).

    NIC links are left out: in every pattern a GPU sends and receives at most
    one flow per step, and a GPU belongs to one job, so they are never shared.
    """
    router = _ecmp_router(spec, seed)
    gpl = spec.gpus_per_leaf
    fabric_from = 2 * spec.total_gpus  # link ids below this are NIC links
    steps = pattern_steps(pattern, gpus, 1.0, _group_size(spec, gpus))
    if len(steps) > MAX_DISTINCT_STEPS and pattern == "a2a":
        stride = len(steps) / MAX_DISTINCT_STEPS
        steps = [steps[int(i * stride)] for i in range(MAX_DISTINCT_STEPS)]
    compiled: list[CompiledStep] = []
    ids: dict[int, int] = {}  # identical steps (ring repeats one flow set) compile once
    order = []
    links: set[int] = set()
    for step in steps:
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
                    path = tuple(link for link in router.path(f.src, f.dst) if link >= fabric_from)
                    cross.append((path, f.nbytes))
                    links.update(path)
            sid = len(compiled)
            compiled.append((tuple(cross), local, ideal))
            ids[id(step.flows)] = sid
        order.append(sid)
    return CompiledJob(tuple(compiled), _period(order), frozenset(links))


def _groups(jobs: Sequence[CompiledJob]) -> list[list[int]]:
    """Indices of jobs that share a fabric link, directly or through others (union-find)."""
    parent = list(range(len(jobs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for j, job in enumerate(jobs):
        for link in job.links:
            k = owner.setdefault(link, j)
            if k != j:
                a, b = root(j), root(k)
                if a != b:
                    parent[a] = b
    out: dict[int, list[int]] = {}
    for j in range(len(jobs)):
        out.setdefault(root(j), []).append(j)
    return list(out.values())


def _step_times(key: Sequence[CompiledStep]) -> list[float]:
    """Each job's time for one aligned step (``key[j]``: job ``j``'s step), max-min fair."""
    counts: Counter[int] = Counter()
    for step in key:
        for links, _ in step[0]:
            counts.update(links)
    hot = {link for link, c in counts.items() if c > 1}
    jt = [step[1] for step in key]
    shared: list[tuple[int, float]] = []
    shared_paths: list[tuple[int, ...]] = []
    for j, step in enumerate(key):
        for links, nbytes in step[0]:
            on_hot = tuple(link for link in links if link in hot) if hot else ()
            if on_hot:
                shared.append((j, nbytes))
                shared_paths.append(on_hot)
            elif nbytes > jt[j]:
                jt[j] = nbytes
    # Links that carry one flow never limit it below the full rate, so the
    # max-min computation only needs the shared links.
    for (j, nbytes), rate in zip(shared, max_min_rates(shared_paths), strict=True):
        jt[j] = max(jt[j], nbytes / rate)
    return jt


def _combine(jobs: Sequence[CompiledJob]) -> tuple[float, ...]:
    """Slowdowns of jobs that run together: step ``t`` of every job at the same time.

    A job shorter than the longest repeats its schedule; with more than
    ``MAX_ALIGNED_STEPS`` aligned steps, that many evenly spaced ones are used.
    """
    longest = max(len(job.schedule) for job in jobs)
    ts: Sequence[int] = range(longest)
    if longest > MAX_ALIGNED_STEPS:
        stride = longest / MAX_ALIGNED_STEPS
        ts = [int(i * stride) for i in range(MAX_ALIGNED_STEPS)]
    times = [0.0] * len(jobs)
    ideals = [0.0] * len(jobs)
    seen: dict[tuple[int, ...], list[float]] = {}
    for t in ts:
        sids = tuple(job.schedule[t % len(job.schedule)] for job in jobs)
        hit = seen.get(sids)
        if hit is None:
            hit = _step_times([job.steps[s] for job, s in zip(jobs, sids, strict=True)])
            seen[sids] = hit
        for j, job in enumerate(jobs):
            times[j] += hit[j]
            ideals[j] += job.steps[sids[j]][2]
    return tuple(tm / i if i > 0 else 1.0 for tm, i in zip(times, ideals, strict=True))


@lru_cache(maxsize=16384)
def _group_slowdowns(
    spec: FabricSpec, group: tuple[tuple[tuple[int, ...], str], ...], seed: int
) -> tuple[float, ...]:
    """Slowdowns of one group of interacting jobs, memoised: an event elsewhere keeps it.

    A group of one still has a slowdown: a job's own flows may hash onto one link.
    """
    return _combine([_compile_job(spec, gpus, pattern, seed) for gpus, pattern in group])


@lru_cache(maxsize=8192)
def _spans_leaves(gpus: tuple[int, ...], gpus_per_leaf: int) -> bool:
    """Whether a job's GPUs sit under two or more leaves (only then it uses the fabric)."""
    first = gpus[0] // gpus_per_leaf if gpus else 0
    return any(g // gpus_per_leaf != first for g in gpus)


def _group_size(spec: FabricSpec, gpus: Sequence[int]) -> int:
    """GPUs per leaf of a job when every leaf holds the same number, else all of them."""
    per_leaf = Counter(spec.leaf_of(g) for g in gpus)
    sizes = set(per_leaf.values())
    return sizes.pop() if len(sizes) == 1 else len(gpus)


def ecmp_slowdown(
    spec: FabricSpec,
    jobs_gpu_lists: Sequence[Sequence[int]],
    pattern: str | Sequence[str] = "ring",
    seed: int = 0,
) -> tuple[float, ...]:
    """Communication slowdown of each job when all of them run their collectives under ECMP.

    ``jobs_gpu_lists[j]`` is job ``j``'s GPUs in rank order; ``pattern`` names
    every job's collective (one name for all, or one per job). Jobs that share
    no fabric link, directly or through others, do not affect each other, so
    each group of interacting jobs is analysed on its own (and memoised: the
    simulator's next event usually changes one group). Within a group, step
    ``t`` of every job runs concurrently with step ``t`` of the others (a job
    with a shorter repeating schedule repeats it while the longest runs).
    Returns one factor ``>= 1`` per job, in input order.
    """
    jobs = tuple(
        gpus if type(gpus) is tuple else tuple(int(g) for g in gpus) for gpus in jobs_gpu_lists
    )
    patterns = [pattern] * len(jobs) if isinstance(pattern, str) else list(pattern)
    if len(patterns) != len(jobs):
        raise ValueError(f"{len(patterns)} patterns for {len(jobs)} jobs")
    for p in set(patterns):
        if p not in PATTERNS:
            raise ValueError(f"unknown pattern {p!r}; expected one of {', '.join(PATTERNS)}")
    total = spec.total_gpus
    for gpus in jobs:
        if gpus and not (min(gpus) >= 0 and max(gpus) < total):
            for g in gpus:
                spec.check_gpu(g)  # raises with the offending id
    out = [1.0] * len(jobs)
    gpl = spec.gpus_per_leaf
    # Only jobs on two or more leaves send over the fabric.
    wide = [j for j, gpus in enumerate(jobs) if _spans_leaves(gpus, gpl)]
    compiled = [_compile_job(spec, jobs[j], patterns[j], seed) for j in wide]
    for members in _groups(compiled):
        idx = sorted((wide[m] for m in members), key=lambda j: (jobs[j], patterns[j]))
        group = tuple((jobs[j], patterns[j]) for j in idx)
        for j, s in zip(idx, _group_slowdowns(spec, group, seed), strict=True):
            out[j] = s
    return tuple(out)
