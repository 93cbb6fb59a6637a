"""FIFO under tenant quotas: a job the quota holds back is no candidate, in the simulator
as in the tick and the forecast (whose snapshots leave it out)."""

from __future__ import annotations

from scheduler.forecast import forecast_pass
from scheduler.policies import get_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.traces import TraceJob
from scheduler.types import Start


def test_a_held_back_head_of_the_fifo_line_blocks_nobody_in_the_three_passes() -> None:
    """a holds its 4; c runs on 2; a2 (a, 4) is held back by a's quota and does not fit
    the 2 free GPUs either; b1 behind it starts, as in the forecast's pass."""
    quota = {"a": 4}
    trace = [
        TraceJob("a1", 0.0, 4, 1000.0, tenant="a"),
        TraceJob("c1", 0.0, 2, 1000.0, tenant="c"),
        TraceJob("a2", 1.0, 4, 100.0, tenant="a"),
        TraceJob("b1", 2.0, 2, 100.0, tenant="b"),
    ]
    result = simulate(trace, get_policy("fifo"), SimConfig(total_gpus=8, quota=quota))
    starts = {r.id: r.start for r in result.jobs}
    assert starts["b1"] == 2.0 and starts["a2"] == 1000.0

    busy = {**dict.fromkeys(range(4), "a1"), 4: "c1", 5: "c1"}
    state = snapshot(
        2.0,
        cluster(busy=busy),
        running("a1", (0, 1, 2, 3), tenant="a"),
        running("c1", (4, 5), tenant="c"),
        queued("a2", 4, submit=1.0, tenant="a"),
        queued("b1", 2, submit=2.0, tenant="b"),
    )
    first = forecast_pass(get_policy("fifo"), quota).run(state)
    assert first.decisions == [Start("b1", (6, 7))]
    assert first.waits == {"a2": "tenant a holds 4 of its 4-GPU quota"}
