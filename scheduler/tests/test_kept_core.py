"""A kept core decides exactly as a fresh one: random snapshot sequences, every policy.

Each sequence is a small cluster that lives: the fresh policy's decisions are
applied (starts, stops, resizes), jobs finish and arrive, their service moves,
their priority and size change, tenants' usage moves, GPUs go down and come
back, time jumps across ageing periods and tiny steps alike.  An unchanged job
keeps its view object (as the tick's kept state does), sometimes an equal copy.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.policies.kept import KeptPolicy
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
CURVES = [None, {1: 100.0, 2: 190.0, 4: 340.0, 8: 560.0, 16: 600.0}, {1: 50.0, 2: 99.0, 3: 140.0}]


class World:
    """A cluster whose jobs move between passes; ``snapshot()`` is the policy's view of it."""

    def __init__(self, rng: random.Random, *, fair: bool) -> None:
        self.rng = rng
        self.gpus = rng.choice([8, 16, 32, 48])
        self.down: set[int] = set()
        self.gpu_views: dict[tuple[int, GpuState, str | None], Gpu] = {}
        self.jobs: dict[str, JobView] = {}
        self.now = rng.uniform(0, 1000)
        self.next_id = 0
        self.tenants: dict[str, TenantShare] = (
            {name: TenantShare(rng.choice([1.0, 2.0]), rng.uniform(0, 1e5)) for name in "abc"}
            if fair
            else {}
        )
        for _ in range(rng.randint(0, 30)):
            self.arrive()

    def arrive(self) -> None:
        """A new queued job (sometimes at the same submit time as another: ties by id)."""
        rng = self.rng
        self.next_id += 1
        size = rng.choice([1, 1, 2, 2, 3, 4, 8])
        submit = rng.choice([self.now, round(self.now / 100) * 100.0, 0.0])
        self.jobs[f"job-{self.next_id:04d}"] = JobView(
            id=f"job-{self.next_id:04d}",
            submit_time=submit,
            requested_gpus=size,
            tenant=rng.choice("abc"),
            min_gpus=max(1, size // 2) if rng.random() < 0.7 else 0,
            max_gpus=size * rng.choice([1, 2, 4]),
            attained_service=rng.choice([0.0, 0.0, rng.uniform(0, 20_000)]),
            remaining_work=rng.choice([None, rng.uniform(10, 50_000)]),
            priority=rng.choice([10, 10, 50, 50, 50, 90]),
            queue_since=rng.choice([None, None, submit + rng.uniform(0, 100)]),
            throughput=rng.choice(CURVES),
        )

    def free(self) -> list[int]:
        held = {g for view in self.jobs.values() for g in view.gpus}
        return [g for g in range(self.gpus) if g not in held and g not in self.down]

    def apply(self, decisions: list[Decision]) -> None:
        """Some of the decisions bound (the others refused or dropped, as quota and fabric may)."""
        for d in decisions:
            view = self.jobs.get(d.job)
            if view is None or self.rng.random() < 0.15:
                continue
            if isinstance(d, Start):
                self.jobs[d.job] = dataclasses.replace(
                    view, gpus=d.gpus, state=JobState.RUNNING, queue_since=self.now
                )
            elif isinstance(d, Preempt):
                since = self.rng.choice([None, self.now])
                self.jobs[d.job] = dataclasses.replace(
                    view, gpus=(), state=JobState.QUEUED, queue_since=since
                )
            elif isinstance(d, Scale):
                self.jobs[d.job] = dataclasses.replace(view, gpus=d.gpus)

    def churn(self) -> None:
        """Jobs finish, arrive, gain service, change class or size; GPUs fail and return."""
        rng = self.rng
        self.now += rng.choice([0.0, 1e-7, rng.uniform(0, 5), rng.uniform(1000, 9000)])
        names = sorted(self.jobs)
        for name in rng.sample(names, min(len(names), rng.randint(0, 4))):
            view = self.jobs[name]
            roll = rng.random()
            if roll < 0.3:
                del self.jobs[name]  # finished
            elif roll < 0.55:
                self.jobs[name] = dataclasses.replace(
                    view, attained_service=view.attained_service + rng.uniform(0, 8000)
                )
            elif roll < 0.7:
                self.jobs[name] = dataclasses.replace(view, priority=rng.choice([10, 50, 90]))
            elif roll < 0.8 and view.gpus and len(view.gpus) > 1:
                self.jobs[name] = dataclasses.replace(view, gpus=view.gpus[:-1])
            elif roll < 0.85:
                self.jobs[name] = dataclasses.replace(view)  # equal, another object
            elif roll < 0.9:  # its last start unknown: a running job's class from ``now``
                self.jobs[name] = dataclasses.replace(view, queue_since=None)
            else:
                self.jobs[name] = dataclasses.replace(view, throughput=rng.choice(CURVES))
        for _ in range(rng.choice([0, 0, 1, 3])):
            self.arrive()
        if rng.random() < 0.1:
            self.down ^= {rng.randrange(self.gpus)}
            self.down -= {g for view in self.jobs.values() for g in view.gpus}
        if self.tenants and rng.random() < 0.2:
            name = rng.choice("abc")
            self.tenants = {**self.tenants, name: TenantShare(1.0, rng.uniform(0, 1e5))}

    def gpu(self, g: int, holder: dict[int, str]) -> Gpu:
        """GPU ``g``'s view: the same object while it does not change (as the tick's)."""
        state = (
            GpuState.DOWN if g in self.down else (GpuState.BUSY if g in holder else GpuState.FREE)
        )
        key = (g, state, holder.get(g))
        view = self.gpu_views.get(key)
        if view is None or self.rng.random() < 0.05:  # sometimes an equal copy
            view = self.gpu_views[key] = Gpu(g, g // 8, g // 16, state, holder.get(g))
        return view

    def snapshot(self) -> Snapshot:
        """The policy's view: every job, the GPUs busy, free or down."""
        holder = {g: view.id for view in self.jobs.values() for g in view.gpus}
        gpus = tuple(self.gpu(g, holder) for g in range(self.gpus))
        jobs = list(self.jobs.values())
        self.rng.shuffle(jobs)  # the policy orders them itself
        return Snapshot(self.now, Cluster(gpus), tuple(jobs), dict(self.tenants))


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_kept_core_decides_as_a_fresh_core(name: str, seed: int) -> None:
    rng = random.Random(f"{name}-{seed}")
    ageing = rng.choice([None, 3600.0, 20_000.0])
    fresh = get_policy(name)
    fresh.class_ageing_s = ageing
    kept_inner = get_policy(name)
    kept_inner.class_ageing_s = ageing
    kept = KeptPolicy(kept_inner)
    world = World(rng, fair=rng.random() < 0.5)
    for step in range(40):
        snapshot = world.snapshot()
        expected = fresh.schedule(snapshot, placement=CountPlacement())
        got = kept.schedule(snapshot, placement=CountPlacement())
        assert got == expected, f"step {step}"
        world.apply(expected)
        world.churn()
    assert kept.rebuilds == 1  # one restored core, kept through every pass


def test_idx_renumbering_keeps_the_decisions() -> None:
    """Many jobs inserted at one spot of view order exhaust the gap: every idx is renumbered."""
    fresh = get_policy("elastic-tiresias")
    kept = KeptPolicy(get_policy("elastic-tiresias"))
    gpus = tuple(Gpu(id=g, server=g // 8, leaf=0) for g in range(16))
    jobs: list[JobView] = [
        JobView(id="job-a", submit_time=0.0, requested_gpus=2, throughput=CURVES[1]),
        JobView(id="job-z", submit_time=1.0, requested_gpus=2, throughput=CURVES[1]),
    ]
    for step in range(70):  # halving a 2**32 gap: renumbered after 32 inserts
        jobs.append(JobView(id=f"job-m{step:03d}", submit_time=0.5, requested_gpus=1))
        snapshot = Snapshot(float(step), Cluster(gpus), tuple(jobs))
        assert kept.schedule(snapshot) == fresh.schedule(snapshot)
        jobs.sort(key=lambda view: view.id, reverse=True)  # ids between: new idx each time


def test_a_failed_pass_drops_the_kept_core() -> None:
    fresh = get_policy("tiresias")
    kept = KeptPolicy(get_policy("tiresias"))
    gpus = tuple(Gpu(id=g, server=0, leaf=0) for g in range(8))
    kept.schedule(Snapshot(0.0, Cluster(gpus), ()))
    assert kept.kept is not None
    snapshot = Snapshot(1.0, Cluster(gpus), (JobView(id="j", submit_time=0.0, requested_gpus=2),))
    with pytest.raises(RuntimeError, match="placement failed"):
        kept.schedule(snapshot, placement=_Refusing())
    assert kept.kept is None
    assert kept.schedule(snapshot) == fresh.schedule(snapshot)
    assert kept.rebuilds == 2


class _Refusing:
    """A placement that fails loudly (a pass that raises half-way)."""

    name = "refusing"

    def place(self, *args: object, **kwargs: object) -> tuple[int, ...] | None:
        raise RuntimeError("placement failed")

    def release(self, job: str) -> None:
        raise RuntimeError("placement failed")
