"""Built-in training programs that jobs name (see ``workers/catalog.py`` for their arguments).

Each module gives ``prepare(args, device) -> Prepared``: the model, optimizer,
data and length of training, built by the worker's main thread while its
background thread joins the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Prepared:
    """A workload ready to train: ``batch(indices)`` gives inputs and labels on the device."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    num_samples: int
    total_steps_for: Callable[[int], int]  # global batch -> total mini-batches
    batch: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
    seed: int


def prepare(name: str, args: dict[str, Any], device: torch.device) -> Prepared:
    """Build the named workload (names as in ``workers.catalog.WORKLOADS``)."""
    if name == "mlp-digits":
        from workers.workloads import mlp_digits

        return mlp_digits.prepare(args, device)
    if name == "resnet18-synthetic":
        from workers.workloads import resnet_synthetic

        return resnet_synthetic.prepare(args, device)
    raise ValueError(f"no implementation for workload {name!r}")
