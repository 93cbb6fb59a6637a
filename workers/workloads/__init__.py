"""Built-in training programs that jobs name (see ``workers/catalog.py`` for their arguments).

Each module gives ``prepare(args, device) -> Prepared``: the model, optimizer,
data and length of training, built by the worker's main thread while its
background thread joins the job.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.workloads.base import Prepared as Prepared  # the type every workload returns


def prepare(name: str, args: dict[str, Any], device: torch.device) -> Prepared:
    """Build the named workload (names as in ``workers.catalog.WORKLOADS``)."""
    # Imported on demand: each pulls in its own data libraries (scikit-learn for the digits).
    if name == "mlp-digits":
        from workers.workloads import mlp_digits

        return mlp_digits.prepare(args, device)
    if name == "resnet18-synthetic":
        from workers.workloads import resnet_synthetic

        return resnet_synthetic.prepare(args, device)
    raise ValueError(f"no implementation for workload {name!r}")
