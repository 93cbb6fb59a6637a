"""An SDK program end to end (one worker process): artifacts, metrics, the final checkpoint.

The program runs as the edl launcher starts one (``EDL_OPTIONS``), logs a
metric every mini-batch and saves its weights at the end; the job's event
stream then holds every point (in few ``metrics`` events), the artifact, and
the final checkpoint before ``finished``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from devtools.elastic import REPO
from workers.artifacts import ArtifactStore
from workers.elastic.checkpoint import Checkpoints
from workers.elastic.cli import OPTIONS_ENV, WorkerOptions, options_to_env
from workers.elastic.control import JobControl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROGRAM = textwrap.dedent(
    """
    import os, sys, torch
    import edl

    def main(ctx):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
        ctx.attach(model, optimizer, edl.ElasticSampler(64, ctx.batch_size, 0), 8)
        for batch in ctx.steps():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                model(x[batch.indices]), y[batch.indices], reduction="sum"
            )
            loss.backward()
            if not ctx.sync_gradients(loss.item(), len(batch.indices)):
                continue
            optimizer.step()
            ctx.notify_batch_end()
            ctx.log_metrics(ctx.step, **{"train/loss": loss.item() / len(batch.indices)})
        path = os.path.join(sys.argv[1], "weights.pt")
        torch.save(model.state_dict(), path)
        ctx.save_artifact(path, name="final/weights.pt")

    edl.run(main)
    """
)


@pytest.fixture
def control(redis_server: str) -> Iterator[JobControl]:
    ctl = JobControl(redis_server, f"p{uuid.uuid4().hex[:8]}")
    yield ctl
    ctl.cleanup()


def test_a_program_saves_an_artifact_logs_metrics_and_ends_with_a_final_checkpoint(
    control: JobControl, redis_server: str, tmp_path: Path
) -> None:
    store_url = str(tmp_path / "job-store")
    options = WorkerOptions(
        job_id=control.job_id,
        worker_id="w0",
        workload="",
        args={},
        batch_size=16,
        recovery="consistent",
        store_url=store_url,
        checkpoint_every=3,
        checkpoint_minutes=None,
        initial_world=1,
        device="cpu",
        redis_url=redis_server,
        max_steps=None,
        step_log=None,
        sync_timeout_s=10.0,
        scale_lead_ms=500.0,
        drop_stragglers=False,
        slow_ms=0.0,
        checkpoint_keep=1,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env[OPTIONS_ENV] = options_to_env(options)
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    events = [e for _id, e in control.read_events()]
    metrics = [e for e in events if e["kind"] == "metrics"]
    steps = [p["step"] for e in metrics for p in e["points"]]
    assert steps == list(range(1, 9)) and len(metrics) <= 3  # buffered, flushed at the end
    assert all(set(p["values"]) == {"train/loss"} for e in metrics for p in e["points"])

    artifact = next(e for e in events if e["kind"] == "artifact_saved")
    assert artifact["path"] == "artifacts/final/weights.pt" and artifact["step"] == 8
    store = ArtifactStore(store_url)
    data = store.read_verified(artifact["path"], artifact["size"], artifact["sha256"])
    assert data == (tmp_path / "weights.pt").read_bytes()

    saved = [(e["step"], e["final"]) for e in events if e["kind"] == "checkpoint_saved"]
    assert saved == [(0, False), (3, False), (6, False), (8, True)]
    kinds = [e["kind"] for e in events]
    assert kinds.index("finished") > max(i for i, k in enumerate(kinds) if k == "checkpoint_saved")
    restored, _ = Checkpoints(store).load_latest()
    assert restored is not None and restored.step == 8
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert all(torch.equal(restored.state["model"][k], v) for k, v in weights.items())
    # keep 1 regular + the final one
    assert [m.step for m in Checkpoints(store).manifests()[0]] == [8, 6]
