"""An elastic training program: an MLP on scikit-learn's 8x8 digits, written on the edl SDK.

Run it as a job with ``launcher: "edl"``; the portal resizes it without
stopping it.  Arguments: ``--epochs N --lr X --hidden H --seed S``.  It logs
its accuracy once an epoch (``ctx.log_metrics``) and saves the trained
weights as the artifact ``model.pt`` (``ctx.save_artifact``).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import edl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main(ctx: edl.Context) -> None:
    args = parse_args()
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32, device=ctx.device)
    y = torch.tensor(digits.target, dtype=torch.long, device=ctx.device)
    torch.manual_seed(args.seed)  # every worker builds the same initial model
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)).to(
        ctx.device
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = -(-len(y) // ctx.batch_size)
    sampler = edl.ElasticSampler(len(y), ctx.batch_size, args.seed)
    ctx.attach(model, optimizer, sampler, args.epochs * steps_per_epoch)
    print(f"edl {edl.__version__}: rank {ctx.rank} of {ctx.world}, from step {ctx.step}")

    for batch in ctx.steps():
        optimizer.zero_grad()
        loss_sum = 0.0
        if len(batch.indices):  # a worker's share can be empty on a tiny last batch
            idx = torch.as_tensor(batch.indices, dtype=torch.long, device=ctx.device)
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum")
            loss.backward()
            loss_sum = loss.item()
        if not ctx.sync_gradients(loss_sum, len(batch.indices)):
            continue  # a peer failed; the job recovered: redo this step
        optimizer.step()
        ctx.notify_batch_end()
        if batch.step % 20 == 0:
            print(f"step {batch.step} epoch {batch.epoch} world {ctx.world} rank {ctx.rank}")
        if ctx.rank == 0 and ctx.step % steps_per_epoch == 0:  # an epoch ended
            ctx.log_metrics(
                ctx.step, accuracy=accuracy(model, x, y), epoch=ctx.step // steps_per_epoch
            )

    if ctx.rank == 0 and ctx.step == ctx.total_steps:  # trained to the end (not asked to leave)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.pt")
            torch.save(model.state_dict(), path)
            stored = ctx.save_artifact(path)
        print(f"saved {stored.path} ({stored.size} bytes, sha256 {stored.sha256[:12]}...)")
    print(f"done at step {ctx.step} (rank {ctx.rank}, generation {ctx.generation})")


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The share of all digits the model classifies right."""
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


if __name__ == "__main__":
    edl.run(main)
