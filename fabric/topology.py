"""Leaf-spine fabric description, GPU numbering and the uplink wiring rule.

A two-tier Clos ("leaf-spine") fabric. Every GPU has its own NIC, cabled to one
port of its leaf switch. A leaf has as many uplinks as GPU-facing ports
(full bisection bandwidth), and uplink port ``u`` of every leaf is cabled to
spine ``u % spines``::

        spine 0        spine 1             uplink u of a leaf -> spine u % spines
         |  \\          /  |                (uplinks = gpus_per_leaf; when that is
         |    \\      /    |                 k * spines, each leaf has k parallel
         |      \\  /      |                 cables to every spine)
         |       /\\       |
         |     /    \\     |
       leaf 0         leaf 1               leaf port p = gpu % gpus_per_leaf
      /  |  |  \\     /  |  |  \\
     g0 g1 g2 g3    g4 g5 g6 g7            gpu = leaf * gpus_per_leaf
     [srv 0][srv 1] [srv 2][srv 3]               + server_in_leaf * gpus_per_server
                                                 + local

GPUs are numbered leaf-major, as above; servers likewise (``server = gpu //
gpus_per_server``). A leaf-spine cable is named by ``(leaf, uplink port)``;
the spine it reaches is ``uplink % spines``. When ``uplinks == spines`` (the
common case) an uplink port *is* a spine number.

An optional optical circuit-switch layer (:class:`OcsSpec`) sits between the
leaves and the spines: OCS ``u`` takes uplink ``u`` of every leaf and
``ports_per_spine`` ports of every spine. Its default patching reproduces the
rule above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fabric.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx

_SPEC_KEYS = {
    "leaves",
    "spines",
    "servers_per_leaf",
    "gpus_per_server",
    "link_gbps",
    "bandwidth",
    "uplinks_per_leaf",
    "ocs",
}


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise TopologyError(f"{name} must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class OcsSpec:
    """Optical circuit switches between leaves and spines.

    There is one OCS per leaf uplink index; each OCS has one port per leaf and
    ``ports_per_spine`` ports per spine, so ``spines * ports_per_spine`` must
    equal the number of leaves. Any free leaf port of an OCS can be patched to
    any free spine port of the same OCS.
    """

    ports_per_spine: int

    def __post_init__(self) -> None:
        _positive_int("ocs.ports_per_spine", self.ports_per_spine)


@dataclass(frozen=True)
class FabricSpec:
    """Sizes of a leaf-spine fabric; validated on construction (:class:`TopologyError`)."""

    leaves: int
    spines: int
    servers_per_leaf: int
    gpus_per_server: int
    link_gbps: float = 100.0
    ocs: OcsSpec | None = None

    def __post_init__(self) -> None:
        for name in ("leaves", "spines", "servers_per_leaf", "gpus_per_server"):
            _positive_int(name, getattr(self, name))
        bw = self.link_gbps
        if isinstance(bw, bool) or not isinstance(bw, int | float) or not bw > 0:
            raise TopologyError(f"link_gbps must be a positive number, got {bw!r}")
        if bw == float("inf"):
            raise TopologyError("link_gbps must be finite")
        if self.gpus_per_leaf % self.spines != 0:
            raise TopologyError(
                f"a leaf's {self.gpus_per_leaf} uplinks cannot spread evenly over "
                f"{self.spines} spines (uplinks must be a multiple of spines)"
            )
        if self.ocs is not None:
            if not isinstance(self.ocs, OcsSpec):
                raise TopologyError("ocs must be an OcsSpec")
            if self.spines * self.ocs.ports_per_spine != self.leaves:
                raise TopologyError(
                    f"each OCS has {self.leaves} leaf ports but {self.spines} spines x "
                    f"{self.ocs.ports_per_spine} spine ports; they must be equal"
                )

    # --- sizes -----------------------------------------------------------------

    @property
    def gpus_per_leaf(self) -> int:
        """GPU-facing ports of a leaf (one per GPU NIC)."""
        return self.servers_per_leaf * self.gpus_per_server

    @property
    def uplinks_per_leaf(self) -> int:
        """Spine-facing ports of a leaf; always equal to :attr:`gpus_per_leaf`."""
        return self.gpus_per_leaf

    @property
    def links_per_pair(self) -> int:
        """Parallel cables between one leaf and one spine."""
        return self.gpus_per_leaf // self.spines

    @property
    def total_gpus(self) -> int:
        """Number of GPUs in the fabric."""
        return self.leaves * self.gpus_per_leaf

    @property
    def servers(self) -> int:
        """Number of servers in the fabric."""
        return self.leaves * self.servers_per_leaf

    # --- numbering -------------------------------------------------------------

    def check_gpu(self, gpu: int) -> int:
        """Return ``gpu`` if it names a GPU of this fabric, else raise :class:`TopologyError`."""
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < self.total_gpus:
            raise TopologyError(f"GPU {gpu!r} is not in 0..{self.total_gpus - 1}")
        return gpu

    def leaf_of(self, gpu: int) -> int:
        """Leaf switch that GPU ``gpu``'s NIC is cabled to."""
        return gpu // self.gpus_per_leaf

    def server_of(self, gpu: int) -> int:
        """Global server index of GPU ``gpu``."""
        return gpu // self.gpus_per_server

    def port_of(self, gpu: int) -> int:
        """GPU-facing port of its leaf that GPU ``gpu``'s NIC uses."""
        return gpu % self.gpus_per_leaf

    def gpu_at(self, leaf: int, port: int) -> int:
        """GPU cabled to ``port`` of ``leaf``."""
        return leaf * self.gpus_per_leaf + port

    def gpus_of_server(self, server: int) -> range:
        """GPUs of global server ``server``."""
        start = server * self.gpus_per_server
        return range(start, start + self.gpus_per_server)

    def gpus_of_leaf(self, leaf: int) -> range:
        """GPUs under ``leaf``."""
        start = leaf * self.gpus_per_leaf
        return range(start, start + self.gpus_per_leaf)

    def spine_of_uplink(self, uplink: int) -> int:
        """Spine reached by uplink port ``uplink`` of any leaf (the wiring rule)."""
        return uplink % self.spines

    # --- serialization ---------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FabricSpec:
        """Build from the JSON topology format.

        Keys: ``leaves``, ``spines``, ``servers_per_leaf``, ``gpus_per_server``;
        optional ``link_gbps`` (alias ``bandwidth``), ``uplinks_per_leaf`` (checked:
        it must equal the GPUs per leaf) and ``ocs`` (``{"ports_per_spine": k}``).
        """
        if not isinstance(data, Mapping):
            raise TopologyError("topology must be a JSON object")
        unknown = sorted(set(data) - _SPEC_KEYS)
        if unknown:
            raise TopologyError(f"unknown topology keys: {', '.join(map(str, unknown))}")
        missing = [
            k for k in ("leaves", "spines", "servers_per_leaf", "gpus_per_server") if k not in data
        ]
        if missing:
            raise TopologyError(f"topology is missing: {', '.join(missing)}")
        if "link_gbps" in data and "bandwidth" in data:
            raise TopologyError("give link_gbps or bandwidth, not both")
        bw = data.get("link_gbps", data.get("bandwidth", 100.0))
        ocs_data = data.get("ocs")
        ocs: OcsSpec | None = None
        if ocs_data is not None:
            if not isinstance(ocs_data, Mapping) or set(ocs_data) != {"ports_per_spine"}:
                raise TopologyError('ocs must be {"ports_per_spine": <int>}')
            ocs = OcsSpec(ports_per_spine=ocs_data["ports_per_spine"])
        spec = cls(
            leaves=data["leaves"],
            spines=data["spines"],
            servers_per_leaf=data["servers_per_leaf"],
            gpus_per_server=data["gpus_per_server"],
            link_gbps=bw,
            ocs=ocs,
        )
        if "uplinks_per_leaf" in data:
            up = _positive_int("uplinks_per_leaf", data["uplinks_per_leaf"])
            if up != spec.gpus_per_leaf:
                raise TopologyError(
                    f"a leaf must have as many uplinks as downlinks: {up} uplinks "
                    f"but {spec.gpus_per_leaf} GPU ports"
                )
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The JSON topology format (inverse of :meth:`from_dict`)."""
        out: dict[str, Any] = {
            "leaves": self.leaves,
            "spines": self.spines,
            "servers_per_leaf": self.servers_per_leaf,
            "gpus_per_server": self.gpus_per_server,
            "link_gbps": self.link_gbps,
        }
        if self.ocs is not None:
            out["ocs"] = {"ports_per_spine": self.ocs.ports_per_spine}
        return out


def load_spec(path: str | Path) -> FabricSpec:
    """Read a topology from a JSON or YAML (``.yaml``/``.yml``) file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read topology {p}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text) if p.suffix.lower() in {".yaml", ".yml"} else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TopologyError(f"topology {p} is not valid: {first}") from exc
    return FabricSpec.from_dict(data)


def leaf_of(spec: FabricSpec, gpu: int) -> int:
    """Leaf of ``gpu`` (see :meth:`FabricSpec.leaf_of`)."""
    return spec.leaf_of(gpu)


def server_of(spec: FabricSpec, gpu: int) -> int:
    """Global server of ``gpu`` (see :meth:`FabricSpec.server_of`)."""
    return spec.server_of(gpu)


def port_of(spec: FabricSpec, gpu: int) -> int:
    """Leaf port of ``gpu`` (see :meth:`FabricSpec.port_of`)."""
    return spec.port_of(gpu)


def to_networkx(spec: FabricSpec) -> nx.MultiGraph:
    """The fabric as an undirected multigraph, for analysis and drawing.

    Nodes are tuples ``("gpu", g)``, ``("server", s)``, ``("leaf", l)``,
    ``("spine", s)`` and, with an OCS layer, ``("ocs", u)``; each has ``kind``
    and ``layer`` attributes (``nx.multipartite_layout(g, subset_key="layer")``
    draws it). GPU-leaf edges carry ``port``; leaf-spine edges carry ``uplink``
    (the leaf's uplink port, which is also the edge key) and ``gbps``. GPUs hang
    off their leaf (their NIC), and are also joined to their server with
    ``kind="nvlink"`` edges. With an OCS, each uplink is drawn as leaf-OCS-spine.
    """
    import networkx as nx  # imported here: `import fabric` stays light for the simulator

    g = nx.MultiGraph(name="leaf-spine")
    for s in range(spec.spines):
        g.add_node(("spine", s), kind="spine", layer=4)
    for u in range(spec.gpus_per_leaf if spec.ocs else 0):
        g.add_node(("ocs", u), kind="ocs", layer=3)
    for leaf in range(spec.leaves):
        g.add_node(("leaf", leaf), kind="leaf", layer=2)
        for u in range(spec.uplinks_per_leaf):
            spine = ("spine", spec.spine_of_uplink(u))
            if spec.ocs is None:
                g.add_edge(
                    ("leaf", leaf), spine, key=u, kind="uplink", uplink=u, gbps=spec.link_gbps
                )
            else:
                g.add_edge(
                    ("leaf", leaf), ("ocs", u), key=u, kind="uplink", uplink=u, gbps=spec.link_gbps
                )
                g.add_edge(
                    ("ocs", u), spine, key=leaf, kind="patch", leaf=leaf, gbps=spec.link_gbps
                )
    for server in range(spec.servers):
        g.add_node(("server", server), kind="server", layer=0)
    for gpu in range(spec.total_gpus):
        g.add_node(
            ("gpu", gpu), kind="gpu", layer=1, leaf=spec.leaf_of(gpu), server=spec.server_of(gpu)
        )
        g.add_edge(
            ("gpu", gpu),
            ("leaf", spec.leaf_of(gpu)),
            kind="nic",
            port=spec.port_of(gpu),
            gbps=spec.link_gbps,
        )
        g.add_edge(("gpu", gpu), ("server", spec.server_of(gpu)), kind="nvlink")
    return g
