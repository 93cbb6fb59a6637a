"""A DDP program that brings its own packages (``requirements.txt``): ``launcher: "torchrun"``.

It imports ``einops`` (pinned) and ``tabulate``, which the node does not have: the
agent installs them from the bundle's ``requirements.txt`` before the program
starts (the first lines of the job's log are that build; a second job with the
same file starts from the cache).  It trains an MLP on scikit-learn's digits,
reshaping each 8x8 image with ``einops.rearrange``, and rank 0 prints a table of
the epochs with ``tabulate``.  It resumes from ``CHECKPOINT_DIR`` like
``examples/torchrun-ddp``.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import einops
import tabulate
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}: einops {einops.__version__}, tabulate {tabulate.__version__}", flush=True)
    checkpoint = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints")) / "ddp.pt"

    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32)  # (n, 8, 8)
    data = TensorDataset(
        einops.rearrange(images, "n h w -> n (h w)"), torch.tensor(digits.target, dtype=torch.long)
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch, rows = 0, []
    if checkpoint.exists():  # a restart (a resize, or a move): resume
        state = torch.load(checkpoint, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, rows = state["epoch"] + 1, state["rows"]

    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        rows.append([epoch, world, round(total / len(loader), 4)])
        if rank == 0:  # a temporary name, then rename: never a half checkpoint
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epoch": epoch, "rows": rows}, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        dist.barrier()

    if rank == 0:
        print(tabulate.tabulate(rows, headers=["epoch", "world", "loss"]), flush=True)
    print(f"rank {rank} of {world}: done", flush=True)
    dist.barrier()  # every rank tears gloo down together
    del model, optimizer, loader
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
