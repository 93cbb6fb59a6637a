"""End to end: a torchrun program's ``METRICS_FILE`` lines reach the job's metrics API.

A real DDP program of two ranks (gloo), started by real agents in their
sandboxes on the real stack, appends JSON lines to the file its environment
names (rank 0 only); the agent tails the
file and sends the points through the same ``metrics`` report that
``ctx.log_metrics`` uses, so they come back from ``/api/v1/jobs/<id>/metrics/``.
A line it cannot believe (NaN) is dropped, and the job's history says so once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_e2e import api, events, job_state, log_text, upload_code, wait_for
from tests.test_e2e import idle_cluster as idle_cluster  # autouse: an idle stack first

pytestmark = [pytest.mark.stack, pytest.mark.slow]

PROGRAM = """\
import json, os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # the torchrun contract: env://
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 4)
y = x.sum(dim=1, keepdim=True)
path = os.environ["METRICS_FILE"]
with open(path, "a") as out:
    for step in range(1, 6):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:  # one worker writes, as the user guide says
            out.write(json.dumps({"step": step * 10, "loss": loss.item(), "acc": step / 10}) + "\\n")
            out.flush()
        time.sleep(0.3)
    if rank == 0:
        out.write('{"step": 60, "loss": NaN}\\n')
        out.write('{"step": 70, "loss": 0.001}')  # the last line, without its newline
print("rank", rank, "metrics in scratch:", os.path.dirname(path) == os.environ["SCRATCH_DIR"])
dist.destroy_process_group()
"""


def test_a_torchrun_program_reports_metrics_through_its_metrics_file(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "main.py").write_text(PROGRAM)
    body = {"name": "metrics-file", "code": upload_code(stack, bundle), "entrypoint": "main.py",
            "launcher": "torchrun", "gpus": 2, "min_gpus": 2, "max_gpus": 2, "batch_size": 8}  # fmt: skip
    job = api(stack, "/api/v1/jobs/", body)
    wait_for("the program to end",
             lambda: job_state(stack, job["id"])["state"] in ("completed", "failed"),
             stack, 300)  # fmt: skip
    text = log_text(stack, job["id"])
    assert job_state(stack, job["id"])["state"] == "completed", text
    assert "rank 0 metrics in scratch: True" in text and "rank 1 metrics in scratch: True" in text

    def metrics() -> dict[str, list[list[Any]]]:
        return dict(api(stack, f"/api/v1/jobs/{job['id']}/metrics/")["metrics"])

    wait_for("the metrics", lambda: len(metrics().get("loss", [])) == 6, stack, 30)
    series = metrics()
    assert [step for step, _ in series["loss"]] == [10, 20, 30, 40, 50, 70]
    losses = [value for _, value in series["loss"]]
    assert losses[:5] == sorted(losses[:5], reverse=True) and losses[0] > losses[4]  # it learns
    assert [step for step, _ in series["acc"]] == [10, 20, 30, 40, 50]
    notes = [e["reason"] for e in events(stack, job["id"]) if "malformed" in e["reason"]]
    assert len(notes) == 1 and "NaN" in notes[0], notes
