"""How large a topology one import may describe (``TOPOLOGY_MAX_*`` settings).

An import creates a row per server and per GPU in one request: without a
bound, ``{"leaves": 100000, "servers_per_leaf": 1000, ...}`` would try to
create a hundred million rows. The generator form, the import form, the API
and ``loadtopology`` all pass through ``check_topology_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from fabric.topology import FabricSpec


class TopologyTooLarge(ValueError):
    """A topology over the limits, with a message that names the field and its bound."""


@dataclass(frozen=True)
class TopologyLimits:
    """Upper bounds of one fabric; ``servers`` bounds leaves x servers_per_leaf."""

    leaves: int
    spines: int
    servers_per_leaf: int
    gpus_per_server: int
    servers: int
    document_bytes: int

    @classmethod
    def from_settings(cls) -> TopologyLimits:
        """The limits this deployment set (``portal.settings.base``)."""
        return cls(
            leaves=settings.TOPOLOGY_MAX_LEAVES,
            spines=settings.TOPOLOGY_MAX_SPINES,
            servers_per_leaf=settings.TOPOLOGY_MAX_SERVERS_PER_LEAF,
            gpus_per_server=settings.TOPOLOGY_MAX_GPUS_PER_SERVER,
            servers=settings.TOPOLOGY_MAX_SERVERS,
            document_bytes=settings.TOPOLOGY_MAX_BYTES,
        )


def check_topology_size(spec: FabricSpec, limits: TopologyLimits) -> None:
    """Refuse a fabric past ``limits`` (``TopologyTooLarge``), before any row is made."""
    for name, value, bound in (
        ("leaves", spec.leaves, limits.leaves),
        ("spines", spec.spines, limits.spines),
        ("servers_per_leaf", spec.servers_per_leaf, limits.servers_per_leaf),
        ("gpus_per_server", spec.gpus_per_server, limits.gpus_per_server),
    ):
        if value > bound:
            raise TopologyTooLarge(f"{name} is {value}: at most {bound} in one fabric")
    servers = spec.leaves * spec.servers_per_leaf
    if servers > limits.servers:
        raise TopologyTooLarge(
            f"servers_per_leaf {spec.servers_per_leaf} on {spec.leaves} leaves makes {servers} "
            f"servers: at most {limits.servers} in one fabric"
        )


def check_document_size(size: int, limits: TopologyLimits) -> None:
    """Refuse a topology document of more than ``limits.document_bytes`` bytes."""
    if size > limits.document_bytes:
        raise TopologyTooLarge(f"the document is over the limit of {limits.document_bytes} bytes")
