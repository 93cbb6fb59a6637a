"""Paths of flows through the fabric: source routing (vClos) and ECMP hashing.

A path is a tuple of *directed link ids* (ints, so that counting them is cheap):

* ``nic_tx(g)``: GPU ``g``'s NIC into its leaf;
* ``up(leaf, u)``: leaf uplink port ``u`` towards spine ``u % spines``;
* ``down(leaf, u)``: from spine ``u % spines`` down the cable that ends on uplink
  port ``u`` of ``leaf``;
* ``nic_rx(g)``: leaf into GPU ``g``'s NIC.

A flow inside one leaf uses ``nic_tx(src), nic_rx(dst)``; across leaves
``nic_tx(src), up(src_leaf, u), down(dst_leaf, u'), nic_rx(dst)``.

Source routing (vClos): leaf ``l`` maps GPU port ``i`` to uplink ``f_l(i)``; a
spine forwards down the parallel cable of the same index (``u' = u``), which is
the one the job reserved on the destination leaf. GPUs outside any given
allocation use the identity map ``f(i) = i``.

ECMP: each switch picks the next hop by hashing the 5-tuple
``(src ip, dst ip, src port, dst port, protocol)`` with mmh3 and a seed, as
RoCE switches do (UDP destination port 4791; the source port is chosen per
connection by the NIC, modelled as a hash of the GPU pair into a port range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import mmh3

from fabric.allocator import Allocation
from fabric.topology import FabricSpec

Path = tuple[int, ...]


class Router(Protocol):
    """Anything that gives the directed links of a flow."""

    spec: FabricSpec

    def path(self, src: int, dst: int) -> Path:
        """Directed link ids from GPU ``src`` to GPU ``dst``."""
        ...


class LinkIds:
    """Encoding of directed links as ints for one fabric, and back to words."""

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self.gpus = spec.total_gpus
        self.uplinks = spec.uplinks_per_leaf
        self.cables = spec.leaves * self.uplinks

    def nic_tx(self, gpu: int) -> int:
        """GPU NIC to leaf."""
        return gpu

    def nic_rx(self, gpu: int) -> int:
        """Leaf to GPU NIC."""
        return self.gpus + gpu

    def up(self, leaf: int, uplink: int) -> int:
        """Leaf to spine over ``uplink``."""
        return 2 * self.gpus + leaf * self.uplinks + uplink

    def down(self, leaf: int, uplink: int) -> int:
        """Spine to leaf over the cable on ``uplink`` of ``leaf``."""
        return 2 * self.gpus + self.cables + leaf * self.uplinks + uplink

    def describe(self, link: int) -> str:
        """Human name, e.g. ``leaf3:u7->spine7`` or ``gpu12->leaf1``."""
        spec = self.spec
        if link < self.gpus:
            return f"gpu{link}->leaf{spec.leaf_of(link)}"
        if link < 2 * self.gpus:
            g = link - self.gpus
            return f"leaf{spec.leaf_of(g)}->gpu{g}"
        rest = link - 2 * self.gpus
        leaf, u = divmod(rest % self.cables, self.uplinks)
        spine = spec.spine_of_uplink(u)
        if rest < self.cables:
            return f"leaf{leaf}:u{u}->spine{spine}"
        return f"spine{spine}->leaf{leaf}:u{u}"

    def is_fabric_link(self, link: int) -> bool:
        """True for leaf-spine links (not NIC links)."""
        return link >= 2 * self.gpus


class SourceRouting:
    """vClos source routing from allocations (see the module docstring)."""

    def __init__(
        self, spec: FabricSpec, allocations: Iterable[Allocation] | Mapping[str, Allocation] = ()
    ) -> None:
        self.spec = spec
        self.ids = LinkIds(spec)
        self._uplink: dict[int, int] = {}
        allocs = allocations.values() if isinstance(allocations, Mapping) else allocations
        gpl = spec.gpus_per_leaf
        for a in allocs:
            if len(a.leaves) < 2:
                continue
            for leaf in a.leaves:
                ports = sorted(g % gpl for g in a.gpus if g // gpl == leaf)
                if a.uplinks:
                    for p, u in zip(ports, a.uplinks, strict=False):
                        self._uplink[leaf * gpl + p] = u
                else:  # only routes known: a spine is an uplink when uplinks == spines
                    for p, s in a.routes.get(leaf, {}).items():
                        self._uplink[leaf * gpl + p] = s
        self._cache: dict[tuple[int, int], Path] = {}

    def uplink_of(self, gpu: int) -> int:
        """Uplink port that GPU ``gpu``'s cross-leaf traffic leaves its leaf on."""
        return self._uplink.get(gpu, gpu % self.spec.gpus_per_leaf)

    def path(self, src: int, dst: int) -> Path:
        """Directed links of the flow ``src -> dst``."""
        key = (src, dst)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        spec, ids = self.spec, self.ids
        ls, ld = spec.leaf_of(src), spec.leaf_of(dst)
        if ls == ld:
            path: Path = (ids.nic_tx(src), ids.nic_rx(dst))
        else:
            u = self.uplink_of(src)
            path = (ids.nic_tx(src), ids.up(ls, u), ids.down(ld, u), ids.nic_rx(dst))
        self._cache[key] = path
        return path


def gpu_ip(spec: FabricSpec, gpu: int) -> str:
    """Address of a GPU's NIC: ``10.<leaf>.<server in leaf>.<local + 1>`` (one subnet per leaf)."""
    leaf = spec.leaf_of(gpu)
    server_in_leaf = (gpu % spec.gpus_per_leaf) // spec.gpus_per_server
    local = gpu % spec.gpus_per_server
    return f"10.{leaf}.{server_in_leaf}.{local + 1}"


class EcmpRouting:
    """ECMP: mmh3 over the 5-tuple picks the uplink (and the parallel down cable).

    ``seed`` is the switches' hash seed (changing it is like changing the hash
    factor); ``sport_range`` is the NIC's UDP source-port range (RoCEv2 uses
    49152-65535); ``dport`` and ``proto`` complete the tuple. ``flow_seed``
    varies the source ports the NICs pick (a different run of the same jobs).
    """

    def __init__(
        self,
        spec: FabricSpec,
        seed: int = 0,
        sport_range: tuple[int, int] = (49152, 65535),
        dport: int = 4791,
        proto: int = 17,
        flow_seed: int = 0,
    ) -> None:
        lo, hi = sport_range
        if not 0 <= lo <= hi <= 65535:
            raise ValueError(f"bad source port range {sport_range}")
        self.spec = spec
        self.seed = seed
        self.sport_range = (lo, hi)
        self.dport = dport
        self.proto = proto
        self.flow_seed = flow_seed
        self.ids = LinkIds(spec)
        self._gpl = spec.gpus_per_leaf
        self._ips = [gpu_ip(spec, g) for g in range(spec.total_gpus)]
        self._cache: dict[tuple[int, int], Path] = {}

    cache_limit = 2_000_000
    """Most flow paths kept in memory; the cache starts over when full."""

    def five_tuple(self, src: int, dst: int) -> tuple[str, str, int, int, int]:
        """The header fields a switch hashes for the flow ``src -> dst``."""
        lo, hi = self.sport_range
        sport = lo + mmh3.hash(f"{src}>{dst}", self.flow_seed, signed=False) % (hi - lo + 1)
        return self._ips[src], self._ips[dst], sport, self.dport, self.proto

    def path(self, src: int, dst: int) -> Path:
        """Directed links of the flow ``src -> dst``."""
        key = (src, dst)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        spec, ids, gpl = self.spec, self.ids, self._gpl
        ls, ld = src // gpl, dst // gpl
        if ls == ld:
            path: Path = (ids.nic_tx(src), ids.nic_rx(dst))
        else:
            header = "{},{},{},{},{}".format(*self.five_tuple(src, dst))
            u = mmh3.hash(header, self.seed, signed=False) % gpl
            spine = u % spec.spines
            k = spec.links_per_pair
            cable = 0 if k == 1 else mmh3.hash(header, self.seed + 1, signed=False) % k
            path = (
                ids.nic_tx(src),
                ids.up(ls, u),
                ids.down(ld, cable * spec.spines + spine),
                ids.nic_rx(dst),
            )
        if len(self._cache) >= self.cache_limit:
            self._cache.clear()  # bounded memory for long simulations on big fabrics
        self._cache[key] = path
        return path
