"""How often ECMP makes flows of concurrent collective jobs collide: the measurement.

A fabric is filled with jobs of ``job_gpus`` GPUs that all run the same
pattern (ring all-reduce by default) at the same time. Placements:

* ``random``: each job gets random GPUs (network-unaware scheduler, as in
  today's clusters and the vClos testbed's "4 random GPUs per server");
* ``vclos``: jobs placed by :class:`~fabric.allocator.VClosAllocator`.

Routings: ``ecmp`` (a fresh hash seed and NIC source ports per trial) and
``source`` (the vClos source-routing maps). Per trial we look at one step of
the pattern with every job active (for ring all steps are the same flows) and
record whether any leaf-spine link carries two or more flows, the worst link's
flow count, and each job's max-min slowdown over its full pattern.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from fabric.allocator import VClosAllocator
from fabric.contention import max_min_rates
from fabric.errors import PlacementError
from fabric.routing import EcmpRouting, LinkIds, Router, SourceRouting
from fabric.topology import FabricSpec
from fabric.traffic import pattern_steps


@dataclass(frozen=True)
class CollisionStats:
    """Results of :func:`measure` for one fabric, placement and routing."""

    spec: FabricSpec
    placement: str
    routing: str
    pattern: str
    job_gpus: int
    jobs: int
    trials: int
    contended_trials: int
    worst_link_hist: tuple[tuple[int, int], ...]  # (worst link's flow count, trials)
    mean_slowdown: float  # mean over jobs and trials
    slowed_job_fraction: float  # jobs with slowdown > 1

    @property
    def p_contention(self) -> float:
        """Fraction of trials where some leaf-spine link carried two or more flows."""
        return self.contended_trials / self.trials if self.trials else 0.0

    def p_worst_at_least(self, k: int) -> float:
        """Fraction of trials whose worst link carried at least ``k`` flows."""
        hits = sum(c for w, c in self.worst_link_hist if w >= k)
        return hits / self.trials if self.trials else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly summary."""
        return {
            "leaves": self.spec.leaves,
            "spines": self.spec.spines,
            "gpus": self.spec.total_gpus,
            "placement": self.placement,
            "routing": self.routing,
            "pattern": self.pattern,
            "job_gpus": self.job_gpus,
            "jobs": self.jobs,
            "trials": self.trials,
            "p_contention": round(self.p_contention, 4),
            "worst_link_hist": {str(w): c for w, c in self.worst_link_hist},
            "mean_slowdown": round(self.mean_slowdown, 4),
            "slowed_job_fraction": round(self.slowed_job_fraction, 4),
        }


def random_jobs(
    spec: FabricSpec, job_gpus: int, rng: random.Random, jobs: int | None = None
) -> list[list[int]]:
    """``jobs`` jobs (default: as many as fit) on random GPUs, ranks in GPU id order."""
    gpus = list(range(spec.total_gpus))
    rng.shuffle(gpus)
    count = spec.total_gpus // job_gpus if jobs is None else min(jobs, spec.total_gpus // job_gpus)
    return [sorted(gpus[i * job_gpus : (i + 1) * job_gpus]) for i in range(count)]


def vclos_jobs(
    spec: FabricSpec, job_gpus: int, jobs_max: int | None = None
) -> tuple[list[list[int]], VClosAllocator]:
    """vClos allocations of ``job_gpus`` each, up to ``jobs_max`` or until one does not fit."""
    alloc = VClosAllocator(spec)
    jobs: list[list[int]] = []
    while jobs_max is None or len(jobs) < jobs_max:
        res = alloc.try_allocate(f"j{len(jobs)}", job_gpus)
        if isinstance(res, PlacementError):
            break
        jobs.append(list(res.gpus))
    return jobs, alloc


def _trial(
    spec: FabricSpec, jobs: list[list[int]], router: Router, pattern: str
) -> tuple[int, list[float]]:
    ids = LinkIds(spec)
    per_job = [pattern_steps(pattern, g, 1.0, _per_leaf(spec, g)) for g in jobs]
    worst = 0
    # Step t of every job runs together (shorter patterns repeat); per job, the sum of its
    # step times over the contention-free sum; identical step combinations computed once.
    longest = max((len(s) for s in per_job), default=0)
    times = [0.0] * len(jobs)
    ideal = [0.0] * len(jobs)
    cache: dict[tuple[int, ...], tuple[list[float], list[float]]] = {}
    for t in range(longest):
        idx = tuple(t % len(s) if s else -1 for s in per_job)
        key = tuple(id(per_job[j][i].flows) if i >= 0 else -1 for j, i in enumerate(idx))
        hit = cache.get(key)
        if hit is None:
            flows = [(j, f) for j, i in enumerate(idx) if i >= 0 for f in per_job[j][i].flows]
            paths = [router.path(f.src, f.dst) for _, f in flows]
            counts: Counter[int] = Counter()
            for path in paths:
                counts.update(link for link in path if ids.is_fabric_link(link))
            worst = max(worst, max(counts.values(), default=0))
            rates = max_min_rates(paths)
            jt = [0.0] * len(jobs)
            ji = [0.0] * len(jobs)
            for (j, f), r in zip(flows, rates, strict=True):
                jt[j] = max(jt[j], f.nbytes / r)
                ji[j] = max(ji[j], f.nbytes)
            hit = (jt, ji)
            cache[key] = hit
        for j in range(len(jobs)):
            times[j] += hit[0][j]
            ideal[j] += hit[1][j]
    return worst, [tm / i if i > 0 else 1.0 for tm, i in zip(times, ideal, strict=True)]


def _per_leaf(spec: FabricSpec, gpus: list[int]) -> int:
    per = Counter(spec.leaf_of(g) for g in gpus)
    sizes = set(per.values())
    return sizes.pop() if len(sizes) == 1 else len(gpus)


def measure(
    spec: FabricSpec,
    job_gpus: int,
    trials: int,
    seed: int = 0,
    placement: str = "random",
    routing: str = "ecmp",
    pattern: str = "ring",
    jobs: int | None = None,
) -> CollisionStats:
    """Run ``trials`` independent trials (new placement for ``random``, new ECMP seeds).

    ``jobs`` limits the number of concurrent jobs (default: fill the fabric).
    """
    if placement not in ("random", "vclos") or routing not in ("ecmp", "source"):
        raise ValueError("placement must be random|vclos and routing ecmp|source")
    if routing == "source" and placement != "vclos":
        raise ValueError("source routing needs vclos placement")
    if not 1 <= job_gpus <= spec.total_gpus:
        raise ValueError(f"job_gpus must be in 1..{spec.total_gpus}")
    rng = random.Random(seed)
    fixed: list[list[int]] | None = None
    fixed_alloc: VClosAllocator | None = None
    if placement == "vclos":
        fixed, fixed_alloc = vclos_jobs(spec, job_gpus, jobs)
    contended = 0
    hist: Counter[int] = Counter()
    slow_sum = 0.0
    slow_n = 0
    slowed = 0
    for _ in range(trials):
        placed = fixed if fixed is not None else random_jobs(spec, job_gpus, rng, jobs)
        router: Router
        if routing == "source":
            assert fixed_alloc is not None
            router = SourceRouting(spec, fixed_alloc.allocations())
        else:
            router = EcmpRouting(spec, seed=rng.getrandbits(32), flow_seed=rng.getrandbits(32))
        worst, slowdowns = _trial(spec, placed, router, pattern)
        contended += worst >= 2
        hist[worst] += 1
        slow_sum += sum(slowdowns)
        slow_n += len(slowdowns)
        slowed += sum(1 for s in slowdowns if s > 1.0 + 1e-9)
    return CollisionStats(
        spec=spec,
        placement=placement,
        routing=routing,
        pattern=pattern,
        job_gpus=job_gpus,
        jobs=len(fixed)
        if fixed is not None
        else len(random_jobs(spec, job_gpus, random.Random(0), jobs)),
        trials=trials,
        contended_trials=contended,
        worst_link_hist=tuple(sorted(hist.items())),
        mean_slowdown=slow_sum / slow_n if slow_n else 1.0,
        slowed_job_fraction=slowed / slow_n if slow_n else 0.0,
    )
