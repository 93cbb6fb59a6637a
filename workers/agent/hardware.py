"""What this node is, for the heartbeat's hardware report: its GPUs, CPU cores, host memory,
and each GPU's health.

Where the GPUs are read, best first::

    NVML (pynvml / nvidia-ml-py, if importable)  model, memory, UUID, and health:
                                                  ECC errors, XID events, temperature,
                                                  utilization, memory used
    torch.cuda (a cuda agent only)               model, memory, UUID; health not reported
    nothing                                      source "none": no GPU figure at all

NVML is an optional import at this boundary (``load_nvml``): nothing here
depends on it being installed, and a test passes a fake object with the few
functions used (``NVML_CALLS``).  Without it the agent says so once, in its
log, and reports health as ``none`` ("not reported"), never a made-up figure.
An agent restricted to some GPUs (``AgentConfig.gpus``) reports only those.

Which agents read GPUs at all (``AGENT_HARDWARE``, ``probe_for``): ``auto`` (the
default) a ``cuda`` agent only — a ``--cpu`` agent's slots are no GPUs, and
several of them may share one GPU host (the demo cluster); ``nvml`` every agent
where NVML loads (a CPU agent on a GPU server that should still report health;
tests); ``none`` no agent.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from workers.protocol import GpuHardware, GpuHealth, Hardware

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")
MIB = 1024 * 1024
NVML_CALLS = (
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTotalEccErrors",
)
"""The NVML functions read (a fake NVML implements these; XID polling is optional)."""


def load_nvml(importer: Callable[[str], Any] = importlib.import_module) -> Any | None:
    """The initialised ``pynvml`` module, or None where it is not installed or has no driver."""
    try:
        nvml = importer("pynvml")
        nvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError: no driver, no GPU, no library
        return None
    return nvml


def host_memory_mib(meminfo: Path = MEMINFO) -> int:
    """Total host memory in MiB (``/proc/meminfo``, else the page count); 0 if unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    except (ValueError, OSError, AttributeError):
        return 0


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _maybe(call: Callable[[], Any]) -> Any:
    """A figure NVML may not support on this GPU: None when it raises."""
    try:
        return call()
    except Exception:  # NVMLError_NotSupported and kin
        return None


def nvml_health(nvml: Any, handle: Any, xid: int | None) -> GpuHealth:
    """One GPU's health as NVML reads it (None where a figure is not supported)."""
    memory = _maybe(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    util = _maybe(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))

    def ecc(kind: str) -> Any:
        return _maybe(
            lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, getattr(nvml, kind), getattr(nvml, "NVML_VOLATILE_ECC", 1)
                )
            )
        )

    temperature = _maybe(
        lambda: float(
            nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        )
    )
    return GpuHealth(
        temperature_c=temperature,
        utilization_pct=None if util is None else float(util.gpu),
        memory_used_mib=None if memory is None else float(memory.used) / MIB,
        ecc_uncorrected=ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ecc_corrected=ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED"),
        xid=xid,
    )


def nvml_gpus(nvml: Any, xids: dict[str, int], only: Iterable[str] = ()) -> tuple[GpuHardware, ...]:
    """Every GPU NVML sees (or only the UUIDs in ``only``), with its health."""
    wanted = set(only)
    out: list[GpuHardware] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        if wanted and uuid not in wanted:
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        out.append(
            GpuHardware(
                model=_text(nvml.nvmlDeviceGetName(handle))[:96],
                memory_mib=int(memory.total) // MIB,
                uuid=uuid[:96],
                health=nvml_health(nvml, handle, xids.get(uuid)),
            )
        )
    return tuple(out)


def torch_gpus() -> tuple[GpuHardware, ...]:
    """The CUDA devices ``torch`` sees: model, memory and UUID (no health)."""
    import torch  # only on a cuda agent, which has imported it already (its config)

    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", "")
        out.append(
            GpuHardware(
                model=str(props.name)[:96],
                memory_mib=int(props.total_memory) // MIB,
                uuid=f"GPU-{uuid}" if uuid and not str(uuid).startswith("GPU-") else str(uuid),
            )
        )
    return tuple(out)


def _register_xids(nvml: Any, handle: Any, kind: Any, events: Any) -> None:
    """Ask NVML for ``handle``'s XID events on ``events`` (a GPU that cannot: no XIDs)."""
    _maybe(lambda: nvml.nvmlDeviceRegisterEvents(handle, kind, events))


HARDWARE_MODES = ("auto", "nvml", "none")
"""The values of ``AGENT_HARDWARE``."""


def probe_for(device: str, only: Iterable[str] = (), mode: str | None = None) -> HardwareProbe:
    """The probe an agent of ``device`` uses under ``mode`` (default: ``AGENT_HARDWARE``)."""
    chosen = mode if mode is not None else os.environ.get("AGENT_HARDWARE", "auto")
    if chosen not in HARDWARE_MODES:
        log.warning("AGENT_HARDWARE=%r is none of %s: auto", chosen, ", ".join(HARDWARE_MODES))
        chosen = "auto"
    cuda = device == "cuda" and chosen != "none"
    reads_nvml = chosen == "nvml" or (chosen == "auto" and cuda)
    return HardwareProbe(load_nvml() if reads_nvml else None, cuda=cuda, only=only)


class HardwareProbe:
    """Reads this node's hardware report, each heartbeat (health changes; so may the GPUs).

    ``nvml``: the initialised NVML module (``load_nvml``) or a fake; ``cuda``:
    whether the agent runs CUDA (the torch fallback); ``only``: the UUIDs of
    the agent's own GPUs, when it is restricted to some.
    """

    def __init__(self, nvml: Any | None, *, cuda: bool, only: Iterable[str] = ()) -> None:
        self.nvml = nvml
        self.cuda = cuda
        self.only = tuple(only)
        self.cpu_cores = os.cpu_count() or 0
        self.memory_mib = host_memory_mib()
        self._xids: dict[str, int] = {}
        self._events = self._watch_xids()
        self._static: tuple[GpuHardware, ...] | None = None
        if nvml is None:
            log.info("GPU health not reported: NVML (pynvml) is not available on this node")

    def _watch_xids(self) -> Any:
        """An NVML event set for XID errors, where the library offers one."""
        nvml = self.nvml
        if nvml is None or not hasattr(nvml, "nvmlEventSetCreate"):
            return None
        events = _maybe(nvml.nvmlEventSetCreate)
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", 0)
        for index in range(int(_maybe(nvml.nvmlDeviceGetCount) or 0)):
            _register_xids(nvml, nvml.nvmlDeviceGetHandleByIndex(index), kind, events)
        return events

    def _poll_xids(self) -> None:
        """Drain waiting XID events into the last XID per GPU UUID (no wait)."""
        nvml, events = self.nvml, self._events
        if nvml is None or events is None:
            return
        for _ in range(64):
            data: Any = _maybe(lambda: nvml.nvmlEventSetWait(events, 0))
            if data is None:
                return
            uuid = _text(
                _maybe(partial(nvml.nvmlDeviceGetUUID, getattr(data, "device", None))) or ""
            )
            self._xids[uuid] = int(getattr(data, "eventData", 0))

    def report(self) -> Hardware:
        """The hardware report now; a failing NVML falls back as if it were absent."""
        cores, memory = min(self.cpu_cores, 4096), self.memory_mib
        if self.nvml is not None:
            self._poll_xids()
            try:
                gpus = nvml_gpus(self.nvml, self._xids, self.only)
            except Exception:
                log.exception("NVML failed: GPU health not reported this time")
            else:
                return Hardware(
                    source="nvml", gpus=gpus[:64], health="nvml", cpu_cores=cores, memory_mib=memory
                )
        if self.cuda:
            if self._static is None:
                self._static = tuple(
                    g for g in torch_gpus() if not self.only or g.uuid in self.only
                )
            return Hardware(
                source="torch", gpus=self._static[:64], cpu_cores=cores, memory_mib=memory
            )
        return Hardware(source="none", cpu_cores=cores, memory_mib=memory)
