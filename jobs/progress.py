"""How far a built-in job is from its end, from what the database holds (pure).

Programs do not say how many mini-batches they train, so only the built-in
workloads have a known end; the forecast and the tick's finishing rule read it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DIGITS_SAMPLES = 1797
"""Samples in scikit-learn's 8x8 digits, the ``mlp-digits`` workload's training set."""


def total_steps(workload: str, args: Mapping[str, Any], batch_size: int) -> int | None:
    """Mini-batches a built-in workload trains in all; None for a program (it does not say)."""
    try:
        if workload == "resnet18-synthetic":
            return int(args["steps"])
        if workload == "mlp-digits":
            return int(args["epochs"]) * -(-DIGITS_SAMPLES // max(1, batch_size))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def seconds_left(
    total: int | None, step: int, batch_size: int, samples_per_s: float | None
) -> float | None:
    """Seconds until a running job's last step at its measured rate; None: unknown."""
    if total is None or not samples_per_s or samples_per_s <= 0 or batch_size <= 0:
        return None
    return max(0, total - step) * batch_size / samples_per_s
