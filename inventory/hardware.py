"""An agent's hardware report read against the inventory, and a GPU's health judged.  Pure.

The report is the heartbeat's ``hardware`` (``workers.protocol.Hardware``),
already checked for types and sizes, seen here as plain JSON (inventory sits
below ``workers``' agent)::

    {"source": "nvml" | "torch" | "none", "health": "nvml" | "none",
     "gpus": [{"model", "memory_mib", "uuid", "health": {...} | null}, ...],
     "cpu_cores": 64, "memory_mib": 515000}

``source: none`` (no NVML, no CUDA) says nothing about GPUs: it is never read
as "every GPU is gone".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NOT_REPORTED = "not reported"
"""What a view shows for a figure the agent did not report."""
DIFFERS_PREFIX = "hardware differs: "
"""The start of the reason of a server drained because its report differs from its row."""


@dataclass(frozen=True)
class ServerFacts:
    """What the inventory holds of a server that a report can contradict."""

    gpu_count: int
    gpu_model: str
    uuids: tuple[str, ...]
    """Each GPU's UUID by local index ("" where not known yet)."""


@dataclass(frozen=True)
class HealthLimits:
    """When a GPU is unhealthy: more uncorrectable ECC errors, or hotter, than this."""

    max_ecc_uncorrected: int = 0
    max_temperature_c: float = 90.0


def reported_gpus(hardware: Any) -> list[Mapping[str, Any]] | None:
    """The GPUs a report lists, or None when it cannot tell (no report, ``source: none``)."""
    if not isinstance(hardware, Mapping) or hardware.get("source") not in ("nvml", "torch"):
        return None
    gpus = hardware.get("gpus")
    return [g for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else None


def differences(facts: ServerFacts, hardware: Any) -> list[str]:
    """How a report contradicts the server's row: a GPU gone, another model, another count.

    A model or UUID the row does not know yet is no contradiction (the first
    report fills it in: ``learned``).
    """
    gpus = reported_gpus(hardware)
    if gpus is None:
        return []
    found: list[str] = []
    if facts.gpu_count and len(gpus) != facts.gpu_count:  # 0: a row that never knew it
        found.append(f"{len(gpus)} GPUs reported, {facts.gpu_count} expected")
    models = sorted({str(g.get("model", "")) for g in gpus} - {""})
    if facts.gpu_model and models and models != [facts.gpu_model]:
        found.append(f"model {', '.join(models)} reported, {facts.gpu_model} expected")
    seen = {str(g.get("uuid", "")) for g in gpus}
    gone = [f"GPU {i} ({uuid})" for i, uuid in enumerate(facts.uuids) if uuid and uuid not in seen]
    if gone:
        found.append(f"{', '.join(gone)} gone")
    return found


def learned(facts: ServerFacts, hardware: Any) -> dict[str, Any]:
    """What a matching report adds to a row that did not know it: model, memory, UUIDs."""
    gpus = reported_gpus(hardware)
    if not gpus or differences(facts, hardware):
        return {}
    out: dict[str, Any] = {}
    if not facts.gpu_model:
        out["gpu_model"] = str(gpus[0].get("model", ""))
        out["gpu_memory_mib"] = int(gpus[0].get("memory_mib", 0))
    if not any(facts.uuids):
        out["uuids"] = tuple(str(g.get("uuid", "")) for g in gpus)
    return out


def host_figures(hardware: Any) -> dict[str, int]:
    """The host's CPU cores and memory a report gives (only those it read: non-zero)."""
    if not isinstance(hardware, Mapping):
        return {}
    return {
        name: hardware[name]
        for name in ("cpu_cores", "memory_mib")
        if isinstance(hardware.get(name), int) and hardware[name] > 0
    }


def unhealthy(health: Any, limits: HealthLimits) -> str | None:
    """Why a GPU's health takes it out of service, or None (healthy, or not reported)."""
    if not isinstance(health, Mapping):
        return None
    ecc = health.get("ecc_uncorrected")
    if isinstance(ecc, int) and ecc > limits.max_ecc_uncorrected:
        return f"{ecc} uncorrectable ECC errors (limit {limits.max_ecc_uncorrected})"
    temperature = health.get("temperature_c")
    if isinstance(temperature, int | float) and temperature > limits.max_temperature_c:
        return f"temperature {temperature:g} C above {limits.max_temperature_c:g} C"
    return None


def unhealthy_gpus(hardware: Any, limits: HealthLimits) -> list[tuple[int, str]]:
    """(local index, reason) of each reported GPU its health takes out of service."""
    gpus = reported_gpus(hardware) or []
    verdicts = ((local, unhealthy(gpu.get("health"), limits)) for local, gpu in enumerate(gpus))
    return [(local, reason) for local, reason in verdicts if reason is not None]


def gpu_health_rows(hardware: Any, count: int) -> list[Mapping[str, Any] | None]:
    """Each of ``count`` GPUs' reported health by local index (None: not reported)."""
    gpus: Sequence[Mapping[str, Any]] = reported_gpus(hardware) or []
    if not isinstance(hardware, Mapping) or hardware.get("health") != "nvml":
        return [None] * count
    out: list[Mapping[str, Any] | None] = []
    for local in range(count):
        health = gpus[local].get("health") if local < len(gpus) else None
        out.append(health if isinstance(health, Mapping) else None)
    return out
