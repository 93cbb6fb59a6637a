"""What a server is (typed resources), checked: its GPU type, model and memory, CPU cores,
host memory and labels.  Pure: no Django, no I/O.

A topology document's server entry may carry any of these beside its
``leaf``/``slot``/``node`` (``inventory.services.check_fabric_spec``)::

    {"leaf": 0, "slot": 1, "node": "a100-7",
     "gpu_type": "a100-40g", "gpu_model": "NVIDIA A100-SXM4-40GB",
     "gpu_memory_mib": 40960, "cpu_cores": 64, "memory_mib": 524288,
     "labels": {"pool": "train", "rack": "r12"}}

Each refusal is a ``ServerTypeError`` whose ``field`` names the offending key
(``servers[3].labels``), so a form or API answers a 400 on that field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.gpu_types import TYPE_SLUG

DEFAULT_GPU_TYPE = "default"
LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
LABEL_VALUE = re.compile(r"[A-Za-z0-9._:/=-]{0,63}")
MAX_LABELS = 16
MAX_GPU_MODEL_CHARS = 96
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024  # 4 TiB per GPU: far beyond any part
MAX_CPU_CORES = 4096
MAX_HOST_MEMORY_MIB = 1 << 40  # an exbibyte
POOL_LABEL = "pool"
"""The label that names a server's pool (shown in the cluster view and ``portalctl nodes``)."""
TYPED_FIELDS = ("gpu_type", "gpu_model", "gpu_memory_mib", "cpu_cores", "memory_mib", "labels")


class ServerTypeError(ValueError):
    """A refused server description: ``field`` is the key at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ServerType:
    """A server's typed resources (0 / "" mean "not known")."""

    gpu_type: str = DEFAULT_GPU_TYPE
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    cpu_cores: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    def as_fields(self) -> dict[str, Any]:
        """The ``Server`` model fields this sets."""
        return {name: getattr(self, name) for name in TYPED_FIELDS} | {"labels": dict(self.labels)}


UNTYPED = ServerType()
"""A server nobody typed: the default type, nothing else known."""


def check_count(value: Any, path: str, maximum: int) -> int:
    """An integer from 0 to ``maximum`` (a bool is no integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ServerTypeError(path, f"must be an integer from 0 to {maximum}")
    return value


def check_type_slug(value: Any, path: str = "gpu_type") -> str:
    """A GPU type slug such as ``a100-40g``."""
    if not isinstance(value, str) or not TYPE_SLUG.fullmatch(value):
        raise ServerTypeError(
            path, "must be 1-32 lower-case letters, digits, '.', '_' or '-' (e.g. a100-40g)"
        )
    return value


def check_model_name(value: Any, path: str = "gpu_model") -> str:
    """A GPU model name as the driver gives it (printable text, bounded)."""
    if not isinstance(value, str) or len(value) > MAX_GPU_MODEL_CHARS or not value.isprintable():
        raise ServerTypeError(path, f"must be printable text of at most {MAX_GPU_MODEL_CHARS}")
    return value


def check_labels(value: Any, path: str = "labels") -> dict[str, str]:
    """Labels: at most ``MAX_LABELS`` text keys → text values of a plain charset."""
    if not isinstance(value, Mapping):
        raise ServerTypeError(path, "must be an object of text keys and values")
    if len(value) > MAX_LABELS:
        raise ServerTypeError(path, f"has {len(value)} labels: at most {MAX_LABELS}")
    for key, text in value.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise ServerTypeError(
                path, f"key {str(key)[:70]!r}: 1-63 letters, digits, '.', '_', '/', '-'"
            )
        if not isinstance(text, str) or not LABEL_VALUE.fullmatch(text):
            raise ServerTypeError(
                f"{path}.{key}",
                "must be text of at most 63 letters, digits, '.', '_', ':', '/', '=', '-'",
            )
    return dict(value)


def check_server_type(entry: Mapping[str, Any], path: str) -> ServerType:
    """The typed resources an entry gives (missing keys: not known / the default type)."""
    return ServerType(
        gpu_type=check_type_slug(entry.get("gpu_type", DEFAULT_GPU_TYPE), f"{path}.gpu_type"),
        gpu_model=check_model_name(entry.get("gpu_model", ""), f"{path}.gpu_model"),
        gpu_memory_mib=check_count(
            entry.get("gpu_memory_mib", 0), f"{path}.gpu_memory_mib", MAX_GPU_MEMORY_MIB
        ),
        cpu_cores=check_count(entry.get("cpu_cores", 0), f"{path}.cpu_cores", MAX_CPU_CORES),
        memory_mib=check_count(
            entry.get("memory_mib", 0), f"{path}.memory_mib", MAX_HOST_MEMORY_MIB
        ),
        labels=check_labels(entry.get("labels", {}), f"{path}.labels"),
    )


def pool_of(labels: Any) -> str:
    """A server's pool (its ``pool`` label), "" when it has none."""
    if isinstance(labels, Mapping):
        pool = labels.get(POOL_LABEL, "")
        return pool if isinstance(pool, str) else ""
    return ""
