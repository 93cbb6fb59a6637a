"""The built-in training programs that jobs name, and the arguments each accepts.

Pure data and validation (no torch import): the portal validates submissions
against it, and the elastic runtime looks up the implementation by the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class WorkloadArgumentError(ValueError):
    """A workload name or argument that the catalog does not accept."""


@dataclass(frozen=True)
class ArgSpec:
    """One argument of a workload: its type, default and inclusive range."""

    kind: type[int] | type[float]
    default: int | float
    minimum: int | float
    maximum: int | float
    help: str

    def coerce(self, name: str, value: Any) -> int | float:
        """Check ``value`` against this spec and return it as the right type."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkloadArgumentError(f"argument {name!r} must be a number")
        if self.kind is int and not float(value).is_integer():
            raise WorkloadArgumentError(f"argument {name!r} must be an integer")
        coerced = self.kind(value)
        if not self.minimum <= coerced <= self.maximum:
            raise WorkloadArgumentError(
                f"argument {name!r} must be between {self.minimum} and {self.maximum}"
            )
        return coerced


@dataclass(frozen=True)
class WorkloadSpec:
    """A training program that the runtime provides."""

    name: str
    description: str
    default_batch_size: int
    args: dict[str, ArgSpec] = field(default_factory=dict)

    def defaults(self) -> dict[str, int | float]:
        """The arguments a job gets when it names none."""
        return {key: spec.default for key, spec in self.args.items()}


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="mlp-digits",
            description="A small MLP on scikit-learn's bundled 8x8 digits (real data, no download).",
            default_batch_size=64,
            args={
                "epochs": ArgSpec(int, 20, 1, 100_000, "passes over the training set"),
                "hidden": ArgSpec(int, 128, 8, 4096, "width of the hidden layers"),
                "lr": ArgSpec(float, 0.05, 1e-6, 10.0, "SGD learning rate"),
                "seed": ArgSpec(int, 0, 0, 2**31 - 1, "seed of model and data order"),
            },
        ),
        WorkloadSpec(
            name="resnet18-synthetic",
            description="ResNet-18 (plain torch) on synthetic images, for throughput benchmarks.",
            default_batch_size=32,
            args={
                "steps": ArgSpec(int, 200, 1, 10_000_000, "mini-batches to train"),
                "image_size": ArgSpec(int, 32, 8, 224, "side of the square input images"),
                "num_classes": ArgSpec(int, 10, 2, 1000, "classes of the synthetic labels"),
                "lr": ArgSpec(float, 0.01, 1e-6, 10.0, "SGD learning rate"),
                "seed": ArgSpec(int, 0, 0, 2**31 - 1, "seed of model and data"),
            },
        ),
    )
}


def validate_args(workload: str, args: dict[str, Any] | None) -> dict[str, int | float]:
    """Return the workload's full argument dict (defaults filled in) or raise.

    Unknown workloads, unknown argument names, wrong types and values out of
    range are refused with a message that names the culprit.
    """
    spec = WORKLOADS.get(workload)
    if spec is None:
        known = ", ".join(sorted(WORKLOADS))
        raise WorkloadArgumentError(f"unknown workload {workload!r} (known: {known})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise WorkloadArgumentError("args must be an object of argument names to values")
    unknown = sorted(set(args) - set(spec.args))
    if unknown:
        raise WorkloadArgumentError(
            f"unknown argument(s) for {workload}: {', '.join(map(str, unknown))}"
        )
    result = spec.defaults()
    for key, value in args.items():
        result[key] = spec.args[key].coerce(key, value)
    return result
