"""End to end: an ASHA sweep of 8 trials on the real stack's 8-slot demo cluster.

Each trial is a real ``edl`` program run by the node agents: gradient descent on
``(w - 3)^2`` with the trial's learning rate, so its error shrinks by
``|1 - 2 lr|`` a step and the ranking of the trials is known at every rung
(the largest lr below 0.5 wins).  It trains to ``TRIAL_MAX_STEPS``, logs its loss
there, and the runtime checkpoints when it ends; a promoted trial's next job
starts from that checkpoint (``resume_from``).  The sweep stops the worst at
the first rung, promotes the best, and ends with a best trial whose checkpoint
downloads and holds its trained weight.
"""

from __future__ import annotations

import hashlib
import io
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.test_e2e import api, idle_cluster, log_text, upload_code, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.slow]
__all__ = ["idle_cluster"]  # the shared stack's autouse fixture: earlier jobs ended first

PROGRAM = '''
"""Gradient descent on (w - 3)^2 at the sweep's learning rate, to TRIAL_MAX_STEPS."""
import os

import torch

import edl


def main(ctx):
    torch.set_num_threads(1)
    lr = float(os.environ["HP_LR"])
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = edl.ElasticSampler(4 * ctx.batch_size, ctx.batch_size, 0)
    ctx.attach(model, optimizer, sampler, int(os.environ["TRIAL_MAX_STEPS"]))
    print(f"trial lr {lr} from step {ctx.step}")
    for batch in ctx.steps():
        optimizer.zero_grad()
        count = len(batch.indices)
        loss = count * (model.weight[0, 0] - 3.0) ** 2  # summed over this worker's samples
        loss.backward()
        if not ctx.sync_gradients(float(loss), count):
            continue
        optimizer.step()
        ctx.notify_batch_end()
        if ctx.rank == 0 and ctx.step == ctx.total_steps:
            ctx.log_metrics(ctx.step, loss=float((model.weight[0, 0] - 3.0) ** 2))
    print(f"trial lr {lr} done at step {ctx.step}")


if __name__ == "__main__":
    edl.run(main)
'''

LRS = [0.01, 0.45, 0.05, 0.3, 0.02, 0.4, 0.1, 0.2]  # worst 0.01 (trial 0), best 0.45 (trial 1)


def test_an_asha_sweep_stops_the_worst_promotes_the_best_and_its_checkpoint_downloads(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    code = upload_code(stack, tmp_path)
    sweep = api(
        stack,
        "/api/v1/sweeps/",
        {"name": "lr", "code": code, "entrypoint": "train.py", "launcher": "edl", "gpus": 1,
         "batch_size": 8, "search_space": {"lr": {"type": "grid", "values": LRS}},
         "metric": "loss", "mode": "min", "strategy": "asha", "eta": 2, "min_steps": 4,
         "max_steps": 16, "max_trials": 8},
    )  # fmt: skip
    assert len(sweep["trials"]) == 8

    def shown() -> dict[str, Any]:
        return dict(api(stack, f"/api/v1/sweeps/{sweep['id']}/"))

    wait_for("the sweep to end", lambda: shown()["state"] != "running", stack, 900)
    done = shown()
    story = "\n".join(
        f"#{t['index']} lr {t['params']['lr']}: {t['status']} rung {t['rung']} {t['results']} "
        f"{t['reason']}"
        for t in done["trials"]
    )
    assert done["state"] == "completed", story
    by_index = {t["index"]: t for t in done["trials"]}
    worst, best = by_index[0], by_index[1]
    assert (worst["status"], worst["rung"]) == ("stopped", 0), story
    assert worst["reason"].startswith("lost at rung 0"), story
    assert (best["status"], best["rung"]) == ("completed", 2), story  # rungs of 4, 8, 16 steps
    assert set(best["results"]) == {"0", "1", "2"}, story
    assert done["best"]["index"] == 1 and done["best"]["params"] == {"lr": 0.45}, story
    # the top rung's job resumed from the rung before: its log says where it started
    top_job = best["job"]
    assert "trial lr 0.45 from step 8" in log_text(stack, top_job)
    history = api(stack, f"/api/v1/jobs/{top_job}/events/?page_size=200")["results"]
    assert any("checkpoint at step 8" in e["reason"] for e in history), history
    # the best trial's checkpoint downloads, and holds the weight it trained (3 - 3*0.1^16)
    checkpoint = done["best"]["checkpoint"]
    assert checkpoint is not None and checkpoint["step"] == 16, done["best"]
    listed = api(stack, f"/api/v1/jobs/{top_job}/artifacts/")["results"]
    (row,) = [a for a in listed if a["id"] == checkpoint["id"]]
    request = urllib.request.Request(
        urllib.parse.urljoin(stack["url"], row["download_url"]),
        headers={"Authorization": f"Token {stack['token']}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        blob = response.read()
    assert hashlib.sha256(blob).hexdigest() == row["sha256"]
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    assert state["step"] == 16
    assert float(state["model"]["weight"][0, 0]) == pytest.approx(3.0, abs=1e-9)
