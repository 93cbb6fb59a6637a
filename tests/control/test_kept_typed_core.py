"""Kept cores per GPU-type pool decide exactly as the fresh typed pass: random sequences.

A small mixed cluster lives pass after pass (as ``scheduler/tests/test_kept_core.py``'s
one-type world does): the fresh pass's decisions are applied (some dropped, as quota
and the fabric may), jobs finish and arrive asking for one type, a list of types or
any, with or without a node selector; queued jobs change the types they accept
(so they move from pool to pool), running ones shrink, gain service and change
class; GPUs go down and come back, a server is relabelled, tenants' usage moves.
An unchanged job or GPU keeps its view object, as the tick's kept state does.

The split itself (``scheduler.gpu_types.split_by_type``, rewritten to go through the
GPUs in C) is checked against a plain statement of its rules on the same snapshots.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

import pytest

from scheduler.gpu_types import (
    Labels,
    TypeSplit,
    eligible_gpus,
    is_typed,
    never_satisfiable,
    split_by_type,
)
from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.policies.kept_typed import KeptTypedPolicy
from scheduler.quota import quota_need
from scheduler.types import (
    Cluster,
    Decision,
    Gpu,
    GpuState,
    JobState,
    JobView,
    Preempt,
    Scale,
    Snapshot,
    Start,
    TenantShare,
)

POLICIES = ["fifo", "srtf", "tiresias", "dlas", "elastic-tiresias"]
CURVES = [None, {1: 100.0, 2: 190.0, 4: 340.0, 8: 560.0}, {1: 50.0, 2: 99.0, 3: 140.0}]
TYPES = ("a100", "h100", "l40s")
PER_SERVER = 4


class TypedWorld:
    """A mixed cluster whose jobs move between passes; ``snapshot()`` is the pass's view."""

    def __init__(self, rng: random.Random, types: tuple[str, ...]) -> None:
        self.rng = rng
        self.types = types
        # Servers of each type (2-4 each), ids running server by server.
        self.server_type: list[str] = [t for t in types for _ in range(rng.randint(2, 4))]
        rng.shuffle(self.server_type)
        self.gpus = len(self.server_type) * PER_SERVER
        self.labels: dict[int, Labels] = {
            s: (("pool", rng.choice(["train", "serve"])),) for s in range(len(self.server_type))
        }
        self.down: set[int] = set()
        self.gpu_views: dict[tuple[int, GpuState, str | None], Gpu] = {}
        self.jobs: dict[str, JobView] = {}
        self.now = rng.uniform(0, 1000)
        self.next_id = 0
        self.tenants = {n: TenantShare(rng.choice([1.0, 2.0]), rng.uniform(0, 1e5)) for n in "ab"}
        for _ in range(rng.randint(3, 25)):
            self.arrive()

    def gpu_type(self, gpu: int) -> str:
        return self.server_type[gpu // PER_SERVER]

    def request(self) -> tuple[tuple[str, ...], Labels]:
        """Types a job accepts (none, one, or two in an order) and its selector."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            types: tuple[str, ...] = ()
        elif roll < 0.75:
            types = (rng.choice(self.types),)
        else:
            types = tuple(rng.sample(self.types, 2))
        if rng.random() < 0.05:
            types = ("b200",)  # a type the cluster lacks: never satisfiable
        selector: Labels = (("pool", rng.choice(["train", "serve"])),) if rng.random() < 0.2 else ()
        return types, selector

    def arrive(self) -> None:
        rng = self.rng
        self.next_id += 1
        size = rng.choice([1, 1, 2, 2, 3, 4, 8, 16])
        submit = rng.choice([self.now, round(self.now / 100) * 100.0])
        types, selector = self.request()
        name = f"job-{self.next_id:04d}"
        self.jobs[name] = JobView(
            id=name,
            submit_time=submit,
            requested_gpus=size,
            tenant=rng.choice("ab"),
            min_gpus=max(1, size // 2) if rng.random() < 0.7 else 0,
            max_gpus=size * rng.choice([1, 2, 4]),
            attained_service=rng.choice([0.0, rng.uniform(0, 20_000)]),
            remaining_work=rng.choice([None, rng.uniform(10, 50_000)]),
            priority=rng.choice([10, 50, 50, 90]),
            queue_since=rng.choice([None, submit + rng.uniform(0, 100)]),
            throughput=rng.choice(CURVES),
            gpu_types=types,
            selector=selector,
        )

    def apply(self, decisions: list[Decision]) -> None:
        """Some of the decisions bound (the others refused or dropped)."""
        for d in decisions:
            view = self.jobs.get(d.job)
            if view is None or self.rng.random() < 0.15:
                continue
            if isinstance(d, Start):
                assert len({self.gpu_type(g) for g in d.gpus}) == 1, d  # one type, always
                self.jobs[d.job] = dataclasses.replace(
                    view, gpus=d.gpus, state=JobState.RUNNING, queue_since=self.now
                )
            elif isinstance(d, Preempt):
                self.jobs[d.job] = dataclasses.replace(
                    view, gpus=(), state=JobState.QUEUED, queue_since=self.now
                )
            elif isinstance(d, Scale):
                assert {self.gpu_type(g) for g in d.gpus} == {self.gpu_type(view.gpus[0])}
                self.jobs[d.job] = dataclasses.replace(view, gpus=d.gpus)

    def churn(self) -> None:
        """Jobs end, arrive, change types, shrink, gain service; GPUs and labels change."""
        rng = self.rng
        self.now += rng.choice([0.0, rng.uniform(0, 5), rng.uniform(1000, 9000)])
        names = sorted(self.jobs)
        for name in rng.sample(names, min(len(names), rng.randint(0, 5))):
            view = self.jobs[name]
            roll = rng.random()
            if roll < 0.25:
                del self.jobs[name]  # finished or cancelled
            elif roll < 0.45 and not view.gpus:  # a queued job asks for other types
                types, selector = self.request()
                self.jobs[name] = dataclasses.replace(view, gpu_types=types, selector=selector)
            elif roll < 0.6:
                self.jobs[name] = dataclasses.replace(
                    view, attained_service=view.attained_service + rng.uniform(0, 8000)
                )
            elif roll < 0.7:
                self.jobs[name] = dataclasses.replace(view, priority=rng.choice([10, 50, 90]))
            elif roll < 0.85 and len(view.gpus) > 1:  # scaled in by its runtime
                self.jobs[name] = dataclasses.replace(view, gpus=view.gpus[:-1])
            else:
                self.jobs[name] = dataclasses.replace(view)  # equal, another object
        for _ in range(rng.choice([0, 1, 1, 3])):
            self.arrive()
        if rng.random() < 0.15:
            self.down ^= {rng.randrange(self.gpus)}
            self.down -= {g for view in self.jobs.values() for g in view.gpus}
        if rng.random() < 0.1:
            server = rng.randrange(len(self.server_type))
            self.labels = {**self.labels, server: (("pool", rng.choice(["train", "serve"])),)}
        if rng.random() < 0.2:
            name = rng.choice("ab")
            self.tenants = {**self.tenants, name: TenantShare(1.0, rng.uniform(0, 1e5))}

    def gpu(self, g: int, holder: dict[int, str]) -> Gpu:
        state = (
            GpuState.DOWN if g in self.down else (GpuState.BUSY if g in holder else GpuState.FREE)
        )
        key = (g, state, holder.get(g))
        view = self.gpu_views.get(key)
        if view is None or self.rng.random() < 0.05:  # sometimes an equal copy
            view = self.gpu_views[key] = Gpu(
                g, g // PER_SERVER, g // (2 * PER_SERVER), state, holder.get(g), self.gpu_type(g)
            )
        return view

    def snapshot(self) -> Snapshot:
        holder = {g: view.id for view in self.jobs.values() for g in view.gpus}
        gpus = tuple(self.gpu(g, holder) for g in range(self.gpus))
        jobs = list(self.jobs.values())
        self.rng.shuffle(jobs)
        cluster = Cluster(gpus, server_labels=dict(self.labels))
        return Snapshot(self.now, cluster, tuple(jobs), dict(self.tenants))


def plain_split(snapshot: Snapshot) -> TypeSplit | None:
    """The split's rules stated plainly, one GPU and one job at a time (the reference)."""
    if not is_typed(snapshot):
        return None
    cluster = snapshot.cluster
    by_id = {g.id: g for g in cluster.gpus}
    names = sorted({g.gpu_type for g in cluster.gpus})
    members: dict[str, list[JobView]] = {name: [] for name in names}
    allowed: dict[str, dict[str, frozenset[int]]] = {name: {} for name in names}
    for view in snapshot.jobs:
        if view.gpus:
            gpu = by_id.get(view.gpus[0])
            name = gpu.gpu_type if gpu is not None else ""
            members.setdefault(name, []).append(view)
            allowed.setdefault(name, {})
            if view.selector:
                ids = eligible_gpus(cluster, (name,), view.selector).get(name, [])
                allowed[name][view.id] = frozenset(ids)
    free_left = dict.fromkeys(members, 0)
    for gpu in cluster.gpus:
        if gpu.state is GpuState.FREE:
            free_left[gpu.gpu_type] += 1
    waits: dict[str, str] = {}
    queued = [v for v in snapshot.jobs if not v.gpus]
    queued.sort(key=lambda v: (v.queue_since or v.submit_time, v.submit_time, v.id))
    for view in queued:
        need = quota_need(view.min_gpus, view.requested_gpus)
        reason = never_satisfiable(cluster, view.gpu_types, view.selector, need)
        if reason is not None:
            waits[view.id] = reason
            continue
        eligible = eligible_gpus(cluster, view.gpu_types, view.selector)
        fits = [n for n, ids in eligible.items() if len(ids) >= need]
        free = {n: sum(by_id[g].state is GpuState.FREE for g in ids) for n, ids in eligible.items()}
        name = next((n for n in fits if free[n] >= need and free_left[n] >= need), fits[0])
        free_left[name] -= need
        members[name].append(view)
        if view.selector:
            allowed[name][view.id] = frozenset(eligible[name])
    return _as_split(snapshot, members, allowed, waits)


def _as_split(
    snapshot: Snapshot,
    members: Mapping[str, list[JobView]],
    allowed: Mapping[str, Mapping[str, frozenset[int]]],
    waits: Mapping[str, str],
) -> TypeSplit:
    from scheduler.gpu_types import Pool

    pools = []
    for name, jobs in members.items():
        gpus = tuple(g for g in snapshot.cluster.gpus if g.gpu_type == name)
        cluster = dataclasses.replace(snapshot.cluster, gpus=gpus)
        pool = dataclasses.replace(snapshot, cluster=cluster, jobs=tuple(jobs))
        pools.append(Pool(name, pool, dict(allowed[name])))
    return TypeSplit(tuple(pools), dict(waits))


def same_split(got: TypeSplit | None, expected: TypeSplit | None) -> bool:
    if got is None or expected is None:
        return got is expected
    return dict(got.waits) == dict(expected.waits) and [
        (p.gpu_type, p.snapshot, dict(p.allowed)) for p in got.pools
    ] == [(p.gpu_type, p.snapshot, dict(p.allowed)) for p in expected.pools]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(8))
def test_kept_pool_cores_decide_as_the_fresh_typed_pass(name: str, seed: int) -> None:
    rng = random.Random(f"typed-{name}-{seed}")
    ageing = rng.choice([None, 3600.0])
    fresh = get_policy(name)
    fresh.class_ageing_s = ageing
    inner = get_policy(name)
    inner.class_ageing_s = ageing
    kept = KeptTypedPolicy(inner)
    types = TYPES[: rng.choice([2, 3])]
    world = TypedWorld(rng, types)
    for step in range(40):
        snapshot = world.snapshot()
        assert same_split(split_by_type(snapshot), plain_split(snapshot)), f"split, step {step}"
        expected = fresh.schedule(snapshot, placement=CountPlacement())
        got = kept.schedule(snapshot, placement=CountPlacement())
        assert got == expected, f"step {step}"
        world.apply(expected)
        world.churn()
    assert kept.rebuilds == len(types)  # one core per pool, kept through every pass
    assert set(kept.pools) == set(types)


def test_a_queued_job_that_changes_types_moves_between_the_kept_pools() -> None:
    """A queued job asks for A100s, then H100s, then either: it leaves one kept core and
    joins another; every pass decides as the fresh one (the H100s are full at first)."""
    fresh, kept = get_policy("tiresias"), KeptTypedPolicy(get_policy("tiresias"))
    big = JobView(id="job-0", submit_time=0.0, requested_gpus=8, gpu_types=("h100",))
    job = JobView(id="job-1", submit_time=1.0, requested_gpus=8, gpu_types=("a100",))
    pools = []
    for step, types in enumerate([("a100",), ("h100",), ("h100", "a100"), ("a100",)]):
        job = dataclasses.replace(job, gpu_types=types)
        gpus = tuple(
            Gpu(
                g,
                g // 4,
                g // 8,
                GpuState.BUSY if g in big.gpus else GpuState.FREE,
                big.id if g in big.gpus else None,
                "a100" if g < 8 else "h100",
            )
            for g in range(16)
        )
        snapshot = Snapshot(float(step), Cluster(gpus), (big, job))
        decisions = fresh.schedule(snapshot)
        assert kept.schedule(snapshot) == decisions
        split = split_by_type(snapshot)
        assert split is not None
        pools.append(next(p.gpu_type for p in split.pools if job in p.snapshot.jobs))
        big = next(
            (
                dataclasses.replace(big, gpus=d.gpus, state=JobState.RUNNING, queue_since=0.0)
                for d in decisions
                if isinstance(d, Start) and d.job == big.id
            ),
            big,
        )
    assert pools == ["a100", "h100", "a100", "a100"]  # the full H100s: the next type it takes
    assert kept.rebuilds == 2  # each pool's core kept while the job went back and forth


def test_a_cluster_turning_one_type_and_back_keeps_deciding_as_a_fresh_pass() -> None:
    """Typed (a job asks for a type) → untyped (it ended) → typed again: each pass decides as
    the fresh one, the one-type core and the pool cores taking turns."""
    fresh, kept = get_policy("elastic-tiresias"), KeptTypedPolicy(get_policy("elastic-tiresias"))
    gpus = tuple(Gpu(g, g // 4, g // 8, gpu_type="a100") for g in range(16))
    plain = JobView(id="job-1", submit_time=0.0, requested_gpus=2, max_gpus=4)
    typed = JobView(id="job-2", submit_time=1.0, requested_gpus=2, gpu_types=("a100",))
    for step, jobs in enumerate([(plain, typed), (plain,), (plain, typed), (typed,)]):
        snapshot = Snapshot(float(step), Cluster(gpus), jobs)
        assert kept.schedule(snapshot) == fresh.schedule(snapshot)
        assert (kept.kept is None) == is_typed(snapshot)
        assert bool(kept.pools) == is_typed(snapshot)


def test_a_failed_typed_pass_drops_every_pool_core() -> None:
    gpus = tuple(Gpu(g, g // 4, 0, gpu_type=("a100" if g < 8 else "h100")) for g in range(16))
    kept = KeptTypedPolicy(get_policy("tiresias"))
    kept.schedule(Snapshot(0.0, Cluster(gpus), ()))
    assert set(kept.pools) == {"a100", "h100"}
    job = JobView(id="j", submit_time=0.0, requested_gpus=2, gpu_types=("h100",))
    with pytest.raises(RuntimeError, match="placement failed"):
        kept.schedule(Snapshot(1.0, Cluster(gpus), (job,)), placement=_Refusing())
    assert kept.pools == {}
    snapshot = Snapshot(2.0, Cluster(gpus), (job,))
    assert kept.schedule(snapshot) == get_policy("tiresias").schedule(snapshot)
    assert kept.rebuilds == 4  # two pools, then two again


class _Refusing(CountPlacement):
    def place(self, *args: object, **kwargs: object) -> tuple[int, ...] | None:
        raise RuntimeError("placement failed")


def test_a_job_on_a_gpu_the_cluster_no_longer_lists_has_a_pool_of_the_default_type() -> None:
    """A running job whose GPUs left the cluster (a server removed under it) counts as of the
    default type, in a pool of its own after the cluster's types, as the rules say."""
    gpus = tuple(Gpu(g, g // 4, 0, gpu_type=("a100" if g < 4 else "h100")) for g in range(8))
    for types in (("a100", "h100"), ("a100",)):
        cluster = Cluster(tuple(g for g in gpus if g.gpu_type in types))
        jobs = (
            JobView(id="gone", submit_time=0.0, requested_gpus=1, gpus=(99,)),
            JobView(id="typed", submit_time=1.0, requested_gpus=1, gpu_types=("a100",)),
        )
        snapshot = Snapshot(0.0, cluster, jobs)
        split = split_by_type(snapshot)
        assert same_split(split, plain_split(snapshot))
        assert split is not None and split.pools[-1].gpu_type == ""
        assert [v.id for v in split.pools[-1].snapshot.jobs] == ["gone"]
