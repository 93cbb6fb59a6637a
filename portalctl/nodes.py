"""``portalctl nodes``: the cluster's servers with GPU type, pool, state and health (admins).

The rows come from ``GET /api/v1/servers/`` (and ``/api/v1/servers/pending/``
with ``--pending``); this module turns them into table rows and names the path
that forgets a pending server, nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NODE_COLUMNS = ("NODE", "LEAF/SLOT", "TYPE", "GPUS", "POOL", "STATE", "HEALTH", "REASON")
PENDING_COLUMNS = ("ID", "NODE", "GPUS", "MODEL", "CPUS", "MEMORY MIB", "LAST SEEN")
NOT_REPORTED = "not reported"


def gpus_cell(server: Mapping[str, Any]) -> str:
    """``2`` or ``2 (1 out)`` when some of its GPUs are out of service (suspect)."""
    gpus = server.get("gpus") or []
    out = sum(1 for gpu in gpus if gpu.get("suspect"))
    return f"{len(gpus)} ({out} out)" if out else str(len(gpus))


def health_cell(server: Mapping[str, Any]) -> str:
    """The server's health word, with its hottest GPU where NVML reported temperatures."""
    word = str(server.get("health") or NOT_REPORTED)
    temperatures = [
        gpu["health"]["temperature_c"]
        for gpu in server.get("gpus") or []
        if isinstance(gpu.get("health"), Mapping)
        and isinstance(gpu["health"].get("temperature_c"), int | float)
    ]
    return f"{word}, max {max(temperatures):.0f} C" if temperatures else word


def node_row(server: Mapping[str, Any]) -> list[Any]:
    """One server as a row of ``portalctl nodes``."""
    return [
        server.get("node"),
        f"{server.get('leaf')}/{server.get('slot')}",
        server.get("gpu_type"),
        gpus_cell(server),
        server.get("pool") or "",
        server.get("state"),
        health_cell(server),
        server.get("state_reason") or "",
    ]


def pending_row(pending: Mapping[str, Any]) -> list[Any]:
    """One pending server as a row of ``portalctl nodes --pending`` (a node that came back
    after an admin forgot it is marked so; ``-o json`` has the whole note)."""
    none = pending.get("gpu_source") == "none"
    node = str(pending.get("node"))
    return [
        pending.get("id"),
        f"{node} (forgotten)" if pending.get("forgotten_at") else node,
        NOT_REPORTED if none else pending.get("gpus"),
        pending.get("gpu_model"),
        pending.get("cpu_cores") or NOT_REPORTED,
        pending.get("memory_mib") or NOT_REPORTED,
        str(pending.get("last_seen") or "")[:19].replace("T", " "),
    ]


def forget_path(pending_id: int) -> str:
    """The API path that forgets pending server ``pending_id`` (``POST``; 204, or 404)."""
    if isinstance(pending_id, bool) or not isinstance(pending_id, int) or pending_id < 1:
        raise ValueError(f"a pending server's id is a positive integer, not {pending_id!r}")
    return f"/api/v1/servers/pending/{pending_id}/forget/"
