"""Which GPU each slot of a GPU node is, by UUID, and which device nodes a sandbox gets.

Slot ``k`` of an agent is the ``k``-th GPU the agent may use: the ``k``-th
entry of the agent's own ``CUDA_VISIBLE_DEVICES`` when that is set (a GPU
UUID, or an index in PCI bus order, as ``nvidia-smi`` numbers them), else the
``k``-th GPU of the host in PCI bus order.  The driver describes each GPU in
``/proc/driver/nvidia/gpus/<pci bus id>/information`` (its ``GPU UUID`` and
``Device Minor``, the ``N`` of ``/dev/nvidiaN``).

A program then gets ``CUDA_VISIBLE_DEVICES`` = its slots' UUIDs, and its
sandbox binds only those GPUs' ``/dev/nvidiaN`` plus the driver's control
nodes (``CONTROL_NODES``, where present): it cannot open a co-tenant's GPU
whatever it sets, and an agent restricted by ``CUDA_VISIBLE_DEVICES`` puts
every worker on its own GPU.  When the driver's description cannot be read
(no NVIDIA driver, another layout), ``slot_devices`` answers nothing and the
agent falls back to slot ``k`` = CUDA device ``k`` with every ``/dev/nvidia*``
bound, and says so at start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
CONTROL_NODES: tuple[str, ...] = (
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
    "nvidia-caps",
    "infiniband",
)
"""What every CUDA process needs beside its GPUs' nodes (and RDMA devices, where present)."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU: its UUID (what ``CUDA_VISIBLE_DEVICES`` names) and its device minor."""

    uuid: str
    minor: int


def parse_information(text: str) -> GpuDevice | None:
    """The GPU an ``information`` file describes (None if it names no UUID and minor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    uuid, minor = fields.get("GPU UUID", ""), fields.get("Device Minor", "")
    if not uuid.startswith(("GPU-", "MIG-")) or not minor.isdigit():
        return None
    return GpuDevice(uuid=uuid, minor=int(minor))


def host_gpus(proc: Path = PROC_GPUS) -> list[GpuDevice]:
    """The host's GPUs in PCI bus order (an adapter: reads the driver's files)."""
    out = []
    try:
        buses = sorted(path for path in proc.iterdir() if path.is_dir())
    except OSError:
        return []
    for bus in buses:
        try:
            gpu = parse_information((bus / "information").read_text())
        except OSError:
            gpu = None
        if gpu is not None:
            out.append(gpu)
    return out


def slot_devices(
    host: Sequence[GpuDevice], visible: str | None, slots: int
) -> tuple[GpuDevice, ...]:
    """The GPU of each of the agent's ``slots`` (empty: it cannot be told, fall back).

    ``visible``: the agent's own ``CUDA_VISIBLE_DEVICES`` (UUIDs, or indices in
    PCI bus order); every entry must name a distinct GPU of ``host``.
    """
    if not host:
        return ()
    if visible is None or not visible.strip():
        chosen = list(host)
    else:
        chosen = []
        for entry in (e.strip() for e in visible.split(",")):
            match = _find(host, entry)
            if match is None or match in chosen:
                return ()
            chosen.append(match)
    return tuple(chosen[:slots]) if len(chosen) >= slots else ()


def _find(host: Sequence[GpuDevice], entry: str) -> GpuDevice | None:
    if entry.isdigit():
        index = int(entry)
        return host[index] if index < len(host) else None
    found = [gpu for gpu in host if gpu.uuid == entry or gpu.uuid.startswith(entry)]
    return found[0] if len(found) == 1 and entry.startswith(("GPU-", "MIG-")) else None


def cuda_visible(gpus: Sequence[GpuDevice], slots: Iterable[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process using ``slots``, in that order."""
    if gpus:
        return ",".join(gpus[slot].uuid for slot in slots)
    return ",".join(str(slot) for slot in slots)


def device_nodes(
    gpus: Sequence[GpuDevice], slots: Iterable[int], dev: Path = Path("/dev")
) -> tuple[Path, ...]:
    """The device nodes a sandbox using ``slots`` gets: theirs and the control ones present;
    every ``/dev/nvidia*`` when the slots' GPUs are not known (``slot_devices`` fell back)."""
    if not gpus:
        return tuple(sorted(dev.glob("nvidia*")))
    own = [dev / f"nvidia{gpus[slot].minor}" for slot in slots]
    control = [dev / name for name in CONTROL_NODES if (dev / name).exists()]
    return tuple(own + control)
