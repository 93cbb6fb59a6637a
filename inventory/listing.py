"""Servers as the views, the API and ``portalctl nodes`` show them: type, pool, state, health.

Three queries whatever the cluster's size (servers, GPUs, suspect marks).  A
GPU's health is what its agent's last heartbeat reported (``agent_info``'s
``hardware``), or None: "not reported", never a made-up figure.
"""

from __future__ import annotations

from typing import Any

from inventory.hardware import NOT_REPORTED, gpu_health_rows
from inventory.models import Gpu, PendingServer, Server
from inventory.registration import health_word
from inventory.server_types import pool_of
from inventory.services import plain_time, suspect_in_effect

SERVER_FIELDS = (
    "id",
    "node",
    "leaf",
    "slot",
    "state",
    "state_reason",
    "gpu_type",
    "gpu_model",
    "gpu_memory_mib",
    "gpu_count",
    "cpu_cores",
    "memory_mib",
    "labels",
    "last_heartbeat",
    "agent_info",
)


def server_rows() -> list[dict[str, Any]]:
    """Every server with its type, pool, state (and why), health and GPUs, by position."""
    gpus: dict[int, list[tuple[int, int, str]]] = {}
    for server_id, index, local, uuid in Gpu.objects.order_by("index").values_list(
        "server_id", "index", "local", "uuid"
    ):
        gpus.setdefault(server_id, []).append((index, local, uuid))
    suspect = set(suspect_in_effect().values_list("index", flat=True))
    rows = []
    for row in Server.objects.order_by("leaf", "slot").values(*SERVER_FIELDS):
        info = row.pop("agent_info") or {}
        hardware = info.get("hardware") if isinstance(info, dict) else None
        mine = gpus.get(row["id"], [])
        health = gpu_health_rows(hardware, len(mine))
        rows.append(
            {
                **row,
                "last_heartbeat": plain_time(row["last_heartbeat"]),
                "pool": pool_of(row["labels"]),
                "health": health_word(hardware),
                "gpus": [
                    {"index": index, "local": local, "uuid": uuid, "suspect": index in suspect}
                    | {"health": health[local] if local < len(health) else None}
                    for index, local, uuid in mine
                ],
            }
        )
    return rows


def forgotten_note(forgotten_at: str | None, forgotten_by: str) -> str:
    """What a pending row says of a forget before: "" for a node never forgotten."""
    if forgotten_at is None:
        return ""
    who = f" by {forgotten_by}" if forgotten_by else ""
    return f"forgotten{who} at {forgotten_at[:19].replace('T', ' ')} UTC; reported again since"


def pending_rows() -> list[dict[str, Any]]:
    """Servers waiting for an admin to accept them, with what they reported.

    A forgotten one that stayed silent is not listed; one that reported again is,
    with ``forgotten_at``/``forgotten_by`` and a ``note`` saying so.
    """
    out = []
    for row in PendingServer.listed().order_by("node"):
        hardware = row.hardware if isinstance(row.hardware, dict) else {}
        gpus = hardware.get("gpus") or []
        models = sorted({str(g.get("model", "")) for g in gpus if isinstance(g, dict)} - {""})
        out.append(
            {
                "id": row.pk,
                "node": row.node,
                "gpus": len(gpus),
                "gpu_model": ", ".join(models) or NOT_REPORTED,
                "gpu_source": hardware.get("source", "none"),
                "cpu_cores": hardware.get("cpu_cores", 0),
                "memory_mib": hardware.get("memory_mib", 0),
                "first_seen": plain_time(row.first_seen),
                "last_seen": plain_time(row.last_seen),
                "forgotten_at": plain_time(row.forgotten_at),
                "forgotten_by": row.forgotten_by,
                "note": forgotten_note(plain_time(row.forgotten_at), row.forgotten_by),
            }
        )
    return out


def utilization_by_type(busy: set[int]) -> list[dict[str, Any]]:
    """Per GPU type: how many GPUs, how many of them jobs hold (``busy``: GPU indices)."""
    totals: dict[str, list[int]] = {}
    for gpu_type, index in Gpu.objects.values_list("server__gpu_type", "index"):
        entry = totals.setdefault(gpu_type, [0, 0])
        entry[0] += 1
        entry[1] += index in busy
    return [
        {"gpu_type": t, "gpus": n, "busy": b, "utilization": b / n if n else 0.0}
        for t, (n, b) in sorted(totals.items())
    ]
