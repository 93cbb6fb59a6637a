"""A fake NVML (the few ``pynvml`` functions ``workers.agent.hardware`` calls), for tests.

Each GPU is a ``FakeGpu``; a test changes one (hotter, an ECC error, gone)
and the next report reads the change, as the real library would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024


class FakeNvmlError(Exception):
    """What NVML raises for a figure the GPU does not support."""


@dataclass
class FakeGpu:
    """One fake GPU: what NVML would say of it."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_mib: int = 40960
    used_mib: int = 1024
    temperature_c: int = 45
    utilization: int = 30
    ecc_uncorrected: int | None = 0
    ecc_corrected: int = 0


@dataclass
class FakeNvml:
    """The module-level functions of ``pynvml`` that the agent calls, over ``gpus``."""

    gpus: list[FakeGpu] = field(default_factory=list)
    NVML_TEMPERATURE_GPU: int = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED: int = 0
    NVML_VOLATILE_ECC: int = 0

    def nvmlInit(self) -> None:
        """Nothing to start."""

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes:
        return gpu.name.encode()  # older pynvml answers bytes

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(total=gpu.memory_mib * MIB, used=gpu.used_mib * MIB)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        return gpu.temperature_c

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(gpu=gpu.utilization, memory=10)

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, kind: int, counter: int) -> int:
        value = gpu.ecc_uncorrected if kind == 1 else gpu.ecc_corrected
        if value is None:
            raise FakeNvmlError("not supported")
        return value


def fake_gpus(node: str, count: int, **extra: Any) -> list[FakeGpu]:
    """``count`` fake GPUs with UUIDs unique to ``node``."""
    return [FakeGpu(uuid=f"GPU-{node}-{i:04d}", **extra) for i in range(count)]
