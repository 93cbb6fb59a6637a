"""Tenant quotas over elastic jobs in the simulator: growth toward a request is checked,
and a start over the quota starts on what fits from the job's minimum."""

from __future__ import annotations

from typing import Any

from scheduler.policies import get_policy
from scheduler.simulation import Simulation
from scheduler.simulator import SimConfig
from scheduler.tests.test_sim_quota import watch_quota_use
from scheduler.traces import TraceJob


def _trace(n: int) -> list[TraceJob]:
    return [
        TraceJob(f"j{i}", i * 5.0, 1 + i % 3, 40.0 + 11 * i, tenant="ab"[i % 2],
                 priority=(10, 50, 90)[i % 3])
        for i in range(n)
    ]  # fmt: skip


def test_quotas_hold_in_every_pass_of_an_elastic_run() -> None:
    """Elastic-Tiresias shrinks jobs below their request and grows them back: no pass
    leaves tenant a above its quota (a growth back to a request took it to 4 of its 3),
    and every job still ends."""
    cfg = SimConfig(total_gpus=8, quota={"a": 3}, min_fraction=0.5)
    sim = Simulation(_trace(40), get_policy("elastic-tiresias"), cfg)
    held = watch_quota_use(sim, "a")
    result = sim.run()
    assert len(result.jobs) == 40 and max(held) <= 3


def test_an_elastic_job_whose_request_is_over_the_quota_starts_on_what_fits() -> None:
    """b holds 2 of its 6; its next job asks for 6 with a minimum of 3: it starts at once
    on the 4 that fit, not never."""
    trace = [
        TraceJob("b-first", 0.0, 2, 1000.0, tenant="b"),
        TraceJob("b-elastic", 1.0, 6, 100.0, tenant="b"),
    ]
    cfg = SimConfig(total_gpus=16, quota={"b": 6}, min_fraction=0.5)
    sim = Simulation(trace, get_policy("elastic-tiresias"), cfg)
    sizes: dict[float, int] = {}

    class Watch:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run_parts(self, now: float) -> Any:
            parts = self.inner.run_parts(now)
            job = sim.records[1]
            sizes.setdefault(now, job.alloc if job.running else 0)
            return parts

    sim.scheduling = Watch(sim.scheduling)  # type: ignore[assignment]
    result = sim.run()
    starts = {r.id: r.start for r in result.jobs}
    assert starts["b-elastic"] == 1.0
    assert sizes[1.0] == 4
