"""An elastic program that brings its own packages (``requirements.txt``): ``launcher: "edl"``.

The same packages as ``train_ddp.py`` (``einops`` pinned, ``tabulate``), installed
by the agent before the program starts; the same MLP on the digits, on the edl
SDK, so the portal resizes it without stopping it.  Rank 0 logs the accuracy
once an epoch and prints a table of them at the end.
"""

from __future__ import annotations

import argparse

import einops
import tabulate
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import edl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def main(ctx: edl.Context) -> None:
    args = parse_args()
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32, device=ctx.device)
    x = einops.rearrange(images, "n h w -> n (h w)")
    y = torch.tensor(digits.target, dtype=torch.long, device=ctx.device)
    torch.manual_seed(0)  # every worker builds the same initial model
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = -(-len(y) // ctx.batch_size)
    sampler = edl.ElasticSampler(len(y), ctx.batch_size, 0)
    ctx.attach(model, optimizer, sampler, args.epochs * steps_per_epoch)
    print(f"rank {ctx.rank}: einops {einops.__version__}, tabulate {tabulate.__version__}")
    rows = []
    for batch in ctx.steps():
        optimizer.zero_grad()
        loss_sum = 0.0
        if len(batch.indices):
            idx = torch.as_tensor(batch.indices, dtype=torch.long, device=ctx.device)
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum")
            loss.backward()
            loss_sum = loss.item()
        if not ctx.sync_gradients(loss_sum, len(batch.indices)):
            continue  # a peer failed; the job recovered: redo this step
        optimizer.step()
        ctx.notify_batch_end()
        if ctx.rank == 0 and ctx.step % steps_per_epoch == 0:  # an epoch ended
            with torch.no_grad():
                accuracy = float((model(x).argmax(dim=1) == y).float().mean())
            ctx.log_metrics(ctx.step, accuracy=accuracy)
            rows.append([ctx.step // steps_per_epoch, ctx.world, round(accuracy, 4)])
    if ctx.rank == 0:
        print(tabulate.tabulate(rows, headers=["epoch", "world", "accuracy"]))
    print(f"done at step {ctx.step} (rank {ctx.rank})")


if __name__ == "__main__":
    edl.run(main)
