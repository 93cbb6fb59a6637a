"""``mlp-digits``: a small MLP on scikit-learn's bundled 8x8 digits (1,797 real images)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits  # type: ignore[import-untyped]
from torch import nn

from workers.workloads.base import Prepared


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def prepare(args: dict[str, Any], device: torch.device) -> Prepared:
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32, device=device)
    y = torch.tensor(digits.target, dtype=torch.long, device=device)
    torch.manual_seed(int(args["seed"]))
    model = build_model(int(args["hidden"])).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(args["lr"]), momentum=0.9)
    n = len(y)
    epochs = int(args["epochs"])

    def batch(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long, device=device)
        return x[idx], y[idx]

    return Prepared(
        model=model,
        optimizer=optimizer,
        num_samples=n,
        total_steps_for=lambda global_batch: epochs * -(-n // global_batch),
        batch=batch,
        seed=int(args["seed"]),
    )
