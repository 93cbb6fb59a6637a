"""``resnet18-synthetic``: ResNet-18 (written here in plain torch) on synthetic images.

The images are a fixed seeded pool; sample ``i`` is pool image ``i % pool`` with
label ``i % num_classes``, so the data pipeline costs nothing and the benchmark
measures the model and the runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workers.workloads.base import Prepared

POOL = 256
SAMPLES = 50_000


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18: a 3x3 stem (small images), four stages of two blocks, 64..512 channels."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        )
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        logits: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))
        return logits


def prepare(args: dict[str, Any], device: torch.device) -> Prepared:
    seed = int(args["seed"])
    size = int(args["image_size"])
    classes = int(args["num_classes"])
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(POOL, 3, size, size, generator=gen).to(device)
    torch.manual_seed(seed)
    model = ResNet18(classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(args["lr"]), momentum=0.9)
    steps = int(args["steps"])

    def batch(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long, device=device)
        return pool[idx % POOL], idx % classes

    return Prepared(
        model=model,
        optimizer=optimizer,
        num_samples=SAMPLES,
        total_steps_for=lambda _global_batch: steps,
        batch=batch,
        seed=seed,
    )
