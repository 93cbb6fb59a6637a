"""Periodic checkpoints every N steps, but not more often than ``checkpoint_min_seconds``.

Fast mini-batches (the demo workloads take milliseconds) used to write and report a
checkpoint several times a second; the floor keeps the step cadence for slow steps and
bounds it for fast ones.  Forced and final checkpoints ignore the floor.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
import torch

from workers.artifacts import ArtifactStore
from workers.clock import ManualClock
from workers.elastic.checkpoint import Checkpoints
from workers.elastic.cli import WorkerArgumentError, WorkerOptions, parse_options
from workers.elastic.transfer import StateTransfer, TrainingState


def options(store: Path, redis_url: str, floor: float) -> WorkerOptions:
    return WorkerOptions(
        job_id=f"floor-{uuid.uuid4().hex[:8]}",
        worker_id="w0",
        workload="",
        args={},
        batch_size=4,
        recovery="consistent",
        store_url=f"file://{store}",
        checkpoint_every=2,
        checkpoint_minutes=None,
        initial_world=1,
        device="cpu",
        redis_url=redis_url,
        max_steps=None,
        step_log=None,
        sync_timeout_s=10.0,
        scale_lead_ms=500.0,
        drop_stragglers=False,
        slow_ms=0.0,
        checkpoint_keep=20,
        checkpoint_min_seconds=floor,
    )


def saved_steps(store: Path) -> list[int]:
    manifests, _ = Checkpoints(ArtifactStore(f"file://{store}"), 20).manifests()
    return sorted(m.step for m in manifests)


def run_steps(transfer: StateTransfer, clock: ManualClock, steps: int, step_s: float) -> None:
    model = torch.nn.Linear(2, 1)
    state = TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(1, steps + 1):
        clock.advance(step_s)
        state.step = step
        transfer.maybe_checkpoint(state, rank=0)
    transfer.maybe_checkpoint(state, rank=0, force=True, final=True)


@pytest.mark.parametrize(
    ("floor", "step_s", "expected"),
    [
        (0.0, 0.01, [2, 4, 6, 8, 10, 12]),  # no floor: every 2 steps
        (1.0, 0.01, [12]),  # fast steps: only the final one within 1 s
        (1.0, 0.3, [4, 8, 12]),  # every 2 steps but at least 1 s apart
        (1.0, 0.6, [2, 4, 6, 8, 10, 12]),  # slow steps: the floor never binds
    ],
)
def test_the_floor_bounds_how_often_fast_steps_checkpoint(
    tmp_path: Path, redis_url: str, floor: float, step_s: float, expected: list[int]
) -> None:
    clock = ManualClock()
    transfer = StateTransfer(options(tmp_path, redis_url, floor), torch.device("cpu"), clock)
    run_steps(transfer, clock, 12, step_s)
    # the final checkpoint (step 12) ignores the floor
    assert saved_steps(tmp_path) == expected


def test_the_command_line_takes_the_floor_and_refuses_a_negative_or_nan_one() -> None:
    base = [
        "--job", "j", "--worker", "w0", "--workload", "mlp-digits", "--batch-size", "8",
        "--store-url", "file:///tmp/x", "--redis-url", "redis://x",
    ]  # fmt: skip
    assert parse_options(base).checkpoint_min_seconds == 0.0
    assert parse_options([*base, "--checkpoint-min-seconds", "2.5"]).checkpoint_min_seconds == 2.5
    for bad in ("-1", "nan"):
        with pytest.raises(WorkerArgumentError, match="checkpoint-min-seconds"):
            parse_options([*base, "--checkpoint-min-seconds", bad])
    assert dataclasses.fields(WorkerOptions)  # the option travels in EDL_OPTIONS like the rest
