"""An ordinary PyTorch DDP program, unmodified for the portal: run it with ``launcher: "torchrun"``.

It also runs as is under ``torchrun --nproc-per-node 2 train.py``.  It reads
the torchrun contract (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... through
``init_process_group``'s default ``env://``), saves a checkpoint in
``CHECKPOINT_DIR`` after every epoch and resumes from it, which is what lets
the portal resize it: a resize stops every process (SIGTERM, then a grace
period) and starts them again at the new size.  At the end rank 0 leaves the
trained weights in ``ARTIFACT_DIR``, which the portal uploads to the job's
artifacts (download them from the job page or the API).
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints")) / "ddp.pt"

    digits = load_digits()
    data = TensorDataset(
        torch.tensor(digits.data / 16.0, dtype=torch.float32),
        torch.tensor(digits.target, dtype=torch.long),
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    start_epoch = 0
    if checkpoint.exists():  # a restart (a resize, or a move to other GPUs): resume
        state = torch.load(checkpoint, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    print(f"rank {rank} of {world}: starting at epoch {start_epoch}", flush=True)

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
        print(f"rank {rank} of {world}: epoch {epoch} loss {total / len(loader):.4f}", flush=True)
        if rank == 0:  # write to a temporary name, then rename: never a half checkpoint
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epoch": epoch}, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        dist.barrier()

    if rank == 0:
        artifacts = Path(os.environ.get("ARTIFACT_DIR", "artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), artifacts / "model.pt")
    print(f"rank {rank} of {world}: done", flush=True)
    dist.barrier()  # every rank tears gloo down together: a peer gone first can abort a rank
    # DDP's reducer holds the process group and gloo's pending work: let them go
    # here, while the interpreter is whole.  Left to the interpreter's exit, gloo's
    # threads can be destroyed unjoined, and the rank aborts after its "done".
    del model, optimizer, loader
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
