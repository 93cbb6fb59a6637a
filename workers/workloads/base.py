"""What a built-in workload hands the runtime (kept apart so that workloads import no package)."""

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
