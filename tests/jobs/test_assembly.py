"""The kept snapshot assembly answers as a fresh one after any sequence of changes.

``control.assembly.Assembly`` makes again only the parts of the jobs that
changed and of those that depend on what changed with them (a tenant's queued
jobs on its use, every job of a renamed or re-quota'd tenant, a job that
starts or stops ending soon).  Here random changes of every kind are applied to
rows, holdings, tenants and the ending set, and after each round the kept
assembly, told only which rows changed, must equal :func:`assemble_snapshot`
over the same inputs, part for part.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control import assembly
from control.assembly import Assembly, JobRow, PolicyInput, TenantRow, assemble_snapshot
from fabric.topology import FabricSpec
from jobs.agent_commands import runtime_job_name
from scheduler.types import Gpu as GpuView
from scheduler.types import GpuState, JobView, TenantShare

SPEC = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=4)  # 16 GPUs
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
STATES = ("queued", "queued", "running", "running", "scaling")


class Cluster:
    """What the assembly reads of the cluster: the fabric and who holds which GPUs."""

    def __init__(self) -> None:
        self.spec = SPEC
        self.holdings: dict[int, list[int]] = {}
        self.gpu_types: dict[int, str] = {}  # one type, no labels: today's cluster
        self.server_labels: dict[int, tuple[tuple[str, str], ...]] = {}


@pytest.fixture(autouse=True)
def weights_without_usage(monkeypatch: Any) -> None:
    """Fair share's weights as they are (the usage would be read from the database)."""

    def shares(weights: Mapping[str, float], now: datetime) -> dict[str, TenantShare]:
        return {slug: TenantShare(weight, 0.0) for slug, weight in weights.items()}

    monkeypatch.setattr(assembly, "tenant_shares", shares)


def a_row(rng: random.Random, job_id: int, tenants: list[int]) -> JobRow:
    lo = rng.randint(1, 2)
    gpus = rng.randint(lo, 4)
    hi = rng.choice((gpus, gpus + 2))
    state = rng.choice(STATES)
    return JobRow(
        id=job_id,
        state=state,
        parallelism=rng.randint(lo, hi) if state != "queued" else 0,
        tenant_id=rng.choice(tenants),
        submitted_at=NOW - timedelta(seconds=rng.randint(0, 50) * 10),
        gpus=gpus,
        min_gpus=lo,
        max_gpus=hi,
        attained_gpu_seconds=float(rng.randint(0, 1000)),
        priority=rng.choice((10, 50, 90)),
        profiled={},
        measured={},
        profile_state=rng.choice(("", "", "", "requested", "done")),
    )


def gpu_views(holdings: Mapping[int, list[int]]) -> tuple[GpuView, ...]:
    holder = {gpu: job for job, gpus in holdings.items() for gpu in gpus}
    return tuple(
        GpuView(
            index,
            SPEC.server_of(index),
            SPEC.leaf_of(index),
            GpuState.BUSY if index in holder else GpuState.FREE,
            runtime_job_name(holder[index]) if index in holder else None,
        )
        for index in range(SPEC.total_gpus)
    )


def hold(cluster: Cluster, row: JobRow, rng: random.Random) -> None:
    """Give a running or scaling job GPUs (as many as it holds, any ones)."""
    cluster.holdings.pop(row.id, None)
    if row.state in ("running", "scaling") and row.parallelism:
        cluster.holdings[row.id] = sorted(rng.sample(range(SPEC.total_gpus), row.parallelism))


def same(kept: PolicyInput, fresh: PolicyInput) -> None:
    assert kept.snapshot == fresh.snapshot
    assert kept.ids == fresh.ids
    assert list(kept.held_back.items()) == list(fresh.held_back.items())
    assert kept.book == fresh.book
    assert kept.profile_candidates == fresh.profile_candidates
    assert list(kept.switching.items()) == list(fresh.switching.items())
    assert kept.blocked == fresh.blocked


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_assembly_equals_a_fresh_one_after_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    tenants = {1: TenantRow("a", 6, True, 1.0), 2: TenantRow("b", 4, False, 2.0)}
    tenants[3] = TenantRow("c", 100, True, 1.0)
    cluster = Cluster()
    rows = {job: a_row(rng, job, list(tenants)) for job in range(1, 25)}
    for row in rows.values():
        hold(cluster, row, rng)
    since = {job: NOW - timedelta(minutes=job) for job in rows if job % 3}
    kept, views, curves = Assembly(), {}, {}  # type: ignore[var-annotated]
    next_id, ending = 100, set[int]()
    epoch = (NOW - timedelta(hours=1)).timestamp()
    for round_ in range(30):
        changed: set[int] = set() if round_ else set(rows)  # the first call: every row new
        for _ in range(rng.randint(0, 4)):
            kind = rng.choice(("new", "gone", "row", "grow"))
            if kind == "new":
                rows[next_id] = a_row(rng, next_id, list(tenants))
                hold(cluster, rows[next_id], rng)
                changed.add(next_id)
                next_id += 1
            elif rows and kind == "gone":
                job = rng.choice(sorted(rows))
                del rows[job]
                cluster.holdings.pop(job, None)
                changed.add(job)
            elif rows:
                job = rng.choice(sorted(rows))
                row = rows[job]
                if kind == "grow":
                    state = rng.choice(("running", "queued", "scaling"))
                    size = rng.randint(row.min_gpus, row.max_gpus) if state != "queued" else 0
                    rows[job] = replace(row, state=state, parallelism=size)
                else:
                    rows[job] = replace(row, priority=rng.choice((10, 50, 90)))
                hold(cluster, rows[job], rng)
                changed.add(job)
        if rng.random() < 0.2:  # a tenant renamed or its quota changed: no job row changes
            tenant_id = rng.choice(sorted(tenants))
            old = tenants[tenant_id]
            tenants[tenant_id] = replace(
                old, gpu_quota=rng.randint(2, 10), slug=rng.choice((old.slug, f"{old.slug}x"))
            )
        if rng.random() < 0.3:  # a running job starts (or stops) ending soon
            ending ^= {rng.choice(sorted(rows))}
        for job in changed:  # the owner drops a changed job's memos
            views.pop(job, None)
            curves.pop(job, None)
        ordered = sorted(rows.values(), key=lambda r: (r.submitted_at, r.id))
        gpus = gpu_views(cluster.holdings)
        about = {job for job in ending if job in rows}
        kept_input = kept.assemble(
            cluster, gpus, ordered, dict(tenants), about, since, NOW,
            changed=changed, by_id=rows, curves=curves, epoch=epoch, views=views,
        )  # fmt: skip
        fresh = assemble_snapshot(cluster, gpus, ordered, dict(tenants), about, since, NOW,
                                  epoch=epoch)  # fmt: skip
        same(kept_input, fresh)
        assert round_ or kept_input.snapshot.jobs  # something to compare from the start
    assert any(isinstance(v, JobView) for v in views.values())


def test_a_tenants_use_changing_holds_back_or_lets_in_its_queued_jobs() -> None:
    """Only a running job of the tenant changes; its queued job's hold-back follows."""
    tenants = {1: TenantRow("a", 4, False, 1.0)}
    cluster = Cluster()
    running = JobRow(1, "running", 2, 1, NOW, 2, 1, 2, 0.0, 50, {}, {}, "")
    queued = JobRow(2, "queued", 0, 1, NOW + timedelta(seconds=1), 3, 3, 3, 0.0, 50, {}, {}, "")
    cluster.holdings[1] = [0, 1]
    rows = {1: running, 2: queued}
    kept = Assembly()
    first = kept.assemble(cluster, gpu_views(cluster.holdings), [running, queued], tenants,
                          (), {}, NOW, changed=set(rows), by_id=rows)  # fmt: skip
    assert first.held_back == {2: "tenant a holds 2 of its 4-GPU quota"}
    rows[1] = replace(running, parallelism=1)
    cluster.holdings[1] = [0]
    after = kept.assemble(cluster, gpu_views(cluster.holdings), [rows[1], queued], tenants,
                          (), {}, NOW, changed={1}, by_id=rows)  # fmt: skip
    assert after.held_back == {} and [v.id for v in after.snapshot.jobs] == ["job-1", "job-2"]
