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

import numpy as np
import numpy.typing as npt

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


@dataclass(frozen=True, eq=False)
class CompiledStep:
    """One distinct step of a job under ECMP, as arrays for the combination.

    ``up`` and ``down``: each cross-leaf flow's leaf-spine links (ids counted
    from the first fabric link), ``nbytes`` its bytes; ``local``: the largest
    intra-leaf flow's bytes; ``ideal``: the largest flow's bytes.
    """

    up: npt.NDArray[np.int64]
    down: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.float64]
    local: float
    ideal: float


MAX_DISTINCT_STEPS = 32
"""Most distinct steps of one job the ECMP analysis looks at (all-to-all has ``N-1``).

A pattern with more (only all-to-all of more than 33 ranks) is represented by
this many of its steps, evenly spaced: every all-to-all step moves the same
bytes, so the job's slowdown is estimated from a sample of its shifts.
"""

MAX_ALIGNED_STEPS = 32
"""Most aligned time steps per group of interacting jobs (see :func:`ecmp_slowdown`)."""


@dataclass(frozen=True)
class CompiledJob:
    """A job's distinct steps under ECMP and its schedule over them.

    ``schedule`` is the job's shortest repeating sequence of step ids (a ring
    is one step repeated, so its schedule is that one step).
    """

    steps: tuple[CompiledStep, ...]
    schedule: tuple[int, ...]


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
    n = len(gpus)
    if pattern == "a2a" and n - 1 > MAX_DISTINCT_STEPS:
        # all_to_all's step k-1 is shift k: build only the sampled shifts.
        stride = (n - 1) / MAX_DISTINCT_STEPS
        steps = [
            Step(tuple(Flow(gpus[r], gpus[(r + k) % n], 1.0 / n) for r in range(n)))
            for k in (1 + int(i * stride) for i in range(MAX_DISTINCT_STEPS))
        ]
    else:
        steps = pattern_steps(pattern, gpus, 1.0, _group_size(spec, gpus))
    compiled: list[CompiledStep] = []
    ids: dict[int, int] = {}  # identical steps (ring repeats one flow set) compile once
    order = []
    for step in steps:
        sid = ids.get(id(step.flows))
        if sid is None:
            ups: list[int] = []
            downs: list[int] = []
            sizes: list[float] = []
            local = 0.0
            ideal = 0.0
            for f in step.flows:
                ideal = max(ideal, f.nbytes)
                if f.src // gpl == f.dst // gpl:
                    local = max(local, f.nbytes)
                else:
                    _, up, down, _ = router.path(f.src, f.dst)
                    ups.append(up - fabric_from)
                    downs.append(down - fabric_from)
                    sizes.append(f.nbytes)
            sid = len(compiled)
            compiled.append(
                CompiledStep(
                    np.array(ups, dtype=np.int64),
                    np.array(downs, dtype=np.int64),
                    np.array(sizes, dtype=np.float64),
                    local,
                    ideal,
                )
            )
            ids[id(step.flows)] = sid
        order.append(sid)
    return CompiledJob(tuple(compiled), _period(order))


def _groups(leaf_sets: Sequence[frozenset[int]]) -> list[list[int]]:
    """Indices of jobs that share a leaf, directly or through others (union-find).

    Only jobs under a common leaf can share a link (an uplink belongs to its
    source leaf, a down cable to its destination leaf).
    """
    parent = list(range(len(leaf_sets)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for j, leaves in enumerate(leaf_sets):
        for leaf in leaves:
            k = owner.setdefault(leaf, j)
            if k != j:
                a, b = root(j), root(k)
                if a != b:
                    parent[a] = b
    out: dict[int, list[int]] = {}
    for j in range(len(leaf_sets)):
        out.setdefault(root(j), []).append(j)
    return list(out.values())


def _max_min_pairs(
    a: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    nlinks: int,
    group: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.float64]:
    """Max-min fair rates (progressive filling) of flows on at most two unit links each.

    Flow ``i`` crosses links ``a[i]`` and ``b[i]`` (``-1``: none); the same
    computation as :func:`max_min_rates`, vectorised for the simulator.
    ``group[link]`` splits the links into independent problems (no flow
    crosses two groups) that are filled side by side, each at its own level.
    """
    n = len(a)
    if group is None:
        group = np.zeros(nlinks, dtype=np.int64)
    ngroups = int(group.max()) + 1 if nlinks else 1
    rates = np.zeros(n)
    frozen = np.zeros(n, dtype=bool)
    residual = np.ones(nlinks)
    has_a, has_b = a >= 0, b >= 0
    a0, b0 = np.where(has_a, a, 0), np.where(has_b, b, 0)
    flow_group = group[np.where(has_a, a0, b0)]
    share = np.empty(nlinks)
    level = np.empty(ngroups)
    while not frozen.all():
        live = ~frozen
        active = np.bincount(a[live & has_a], minlength=nlinks) + np.bincount(
            b[live & has_b], minlength=nlinks
        )
        used = active > 0
        share.fill(np.inf)
        np.divide(residual, active, out=share, where=used)
        level.fill(np.inf)
        np.minimum.at(level, group, share)
        tight = used & (share <= level[group] * (1 + 1e-12))
        newly = live & ((has_a & tight[a0]) | (has_b & tight[b0]))
        rates[newly] = level[flow_group[newly]]
        frozen |= newly
        on_a, on_b = newly & has_a, newly & has_b
        residual -= np.bincount(a[on_a], weights=rates[on_a], minlength=nlinks) + np.bincount(
            b[on_b], weights=rates[on_b], minlength=nlinks
        )
    return rates


def _keys_times(keys: Sequence[Sequence[CompiledStep]], nlinks: int) -> npt.NDArray[np.float64]:
    """Each job's time in each aligned step (``keys[k][j]``: job ``j``'s step in the k-th).

    All steps are solved in one max-min computation: a step's links are its
    own (ids offset by ``k * nlinks``), so steps do not interact. Links that
    carry one flow never limit it below the full rate, so the max-min
    computation only needs the flows on shared links.
    """
    nkeys, njobs = len(keys), len(keys[0])
    steps = [step for key in keys for step in key]
    jt = np.array([step.local for step in steps])  # row-major: key k, job j at k * njobs + j
    sizes = [len(step.up) for step in steps]
    if not sum(sizes):
        return jt.reshape(nkeys, njobs)
    cell = np.repeat(np.arange(len(steps)), sizes)  # which (key, job) each flow belongs to
    shift = (cell // njobs) * nlinks
    ups = np.concatenate([step.up for step in steps]) + shift
    downs = np.concatenate([step.down for step in steps]) + shift
    nbytes = np.concatenate([step.nbytes for step in steps])
    both = np.concatenate([ups, downs])
    links, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    hot = counts[inverse] > 1
    hot_up, hot_down = hot[: len(ups)], hot[len(ups) :]
    shared = hot_up | hot_down
    alone = ~shared
    np.maximum.at(jt, cell[alone], nbytes[alone])
    if shared.any():
        # Number the shared links 0..m-1 (-1: not shared) so the filling's arrays are small.
        hot_ids = np.flatnonzero(counts > 1)
        compact = np.full(len(links), -1, dtype=np.int64)
        compact[hot_ids] = np.arange(len(hot_ids))
        a = compact[inverse[: len(ups)]][shared]
        b = compact[inverse[len(ups) :]][shared]
        group = links[hot_ids] // nlinks  # the aligned step each shared link belongs to
        rates = _max_min_pairs(a, b, len(hot_ids), group)
        np.maximum.at(jt, cell[shared], nbytes[shared] / rates)
    return jt.reshape(nkeys, njobs)


def _combine(jobs: Sequence[CompiledJob], nlinks: int) -> tuple[float, ...]:
    """Slowdowns of jobs that run together: step ``t`` of every job at the same time.

    A job shorter than the longest repeats its schedule; with more than
    ``MAX_ALIGNED_STEPS`` aligned steps, that many evenly spaced ones are used.
    Identical combinations of steps are computed once.
    """
    longest = max(len(job.schedule) for job in jobs)
    ts: Sequence[int] = range(longest)
    if longest > MAX_ALIGNED_STEPS:
        stride = longest / MAX_ALIGNED_STEPS
        ts = [int(i * stride) for i in range(MAX_ALIGNED_STEPS)]
    index: dict[tuple[int, ...], int] = {}
    order = []
    for t in ts:
        sids = tuple(job.schedule[t % len(job.schedule)] for job in jobs)
        order.append(index.setdefault(sids, len(index)))
    keys = [[job.steps[s] for job, s in zip(jobs, sids, strict=True)] for sids in index]
    hits = _keys_times(keys, nlinks)
    ideal = np.array([[step.ideal for step in key] for key in keys])
    weight = np.bincount(np.array(order), minlength=len(keys)).astype(float)
    times = weight @ hits
    ideals = weight @ ideal
    return tuple(float(tm / i) if i > 0 else 1.0 for tm, i in zip(times, ideals, strict=True))


@lru_cache(maxsize=16384)
def _group_slowdowns(
    spec: FabricSpec, group: tuple[tuple[tuple[int, ...], str], ...], seed: int
) -> tuple[float, ...]:
    """Slowdowns of one group of interacting jobs, memoised: an event elsewhere keeps it.

    A group of one still has a slowdown: a job's own flows may hash onto one link.
    """
    nlinks = 2 * spec.leaves * spec.uplinks_per_leaf  # leaf-spine links, up and down
    return _combine([_compile_job(spec, gpus, pattern, seed) for gpus, pattern in group], nlinks)


@lru_cache(maxsize=8192)
def _leaves(gpus: tuple[int, ...], gpus_per_leaf: int) -> frozenset[int]:
    """The leaves a job's GPUs sit under (only a job on two or more uses the fabric)."""
    return frozenset(g // gpus_per_leaf for g in gpus)


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
    no leaf, directly or through others, share no link and do not affect each other, so
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
    leaf_sets = [_leaves(gpus, gpl) for gpus in jobs]
    wide = [j for j in range(len(jobs)) if len(leaf_sets[j]) > 1]
    for members in _groups([leaf_sets[j] for j in wide]):
        idx = sorted((wide[m] for m in members), key=lambda j: (jobs[j], patterns[j]))
        group = tuple((jobs[j], patterns[j]) for j in idx)
        for j, s in zip(idx, _group_slowdowns(spec, group, seed), strict=True):
            out[j] = s
    return tuple(out)
