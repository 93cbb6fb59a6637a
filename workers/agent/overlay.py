"""A job's network across hosts: its bridges joined by a VXLAN of its own.

``workers.agent.network`` gives each (job, node) a namespace on a bridge of
the job's; agents of one host share that bridge.  When the job also runs on
other hosts, each host's bridge gets a VXLAN device with the job's own VNI
(its *segment*), and the host forwards the job's frames to every other host
the job is on (head-end replication: one all-zero forwarding entry per peer,
no multicast, no learning from the wire)::

    host 10.0.0.1                                  host 10.0.0.2
    bridge pjb<h(job)> -- vxlan pjx<h(job)>  ~~~UDP 4789~~~  vxlan pjx<h(job)> -- bridge pjb<h(job)>
      +-- veth (job's namespace, node a)             (VNI of the job)    +-- veth (node c)
      +-- veth (node b)

What a job's frames reach is its own namespaces on every host and nothing
else: another job has another VNI (and bridge), the host has no address on
the bridge, and the VXLAN device sends only to the job's hosts.  The
registry (Redis, the agents' own) holds each job's VNI (``HSETNX``, from one
counter, so every host agrees) and the hosts it is on (``h:<address>``); an
agent adds its host when it makes the job's first namespace there, removes
it with the last, and brings its forwarding entries in line with the
registry at every pass (``sync``), so a host that joins is reached within a
pass.

The underlay (the hosts' ``AGENT_ADDRESS`` network) must carry UDP
``SANDBOX_VXLAN_PORT`` between the cluster's hosts and nothing else's:
VXLAN has no authentication, so the operator's firewall keeps other
machines from sending to that port.  The job's interfaces get
``SANDBOX_OVERLAY_MTU`` (1450: 1500 less VXLAN's 50 bytes), so no frame is
too big for the tunnel.  An agent whose ``AGENT_ADDRESS`` is loopback (every
agent on one host) makes no VXLAN.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import redis

VNI_COUNTER = "agent:net:vni-next"
MAX_VNI = 2**24 - 1
ALL_ZERO_MAC = "00:00:00:00:00:00"


@dataclass(frozen=True)
class OverlaySettings:
    """Where this host is on the underlay, and the tunnel's port and the job's MTU."""

    address: str
    port: int = 4789
    mtu: int = 1450

    @property
    def enabled(self) -> bool:
        """Whether jobs here are joined to other hosts (an underlay address, not loopback)."""
        return overlay_wanted(self.address)


def overlay_wanted(address: str) -> bool:
    """An agent on a real address joins hosts; one on loopback shares one host's bridges."""
    try:
        return not ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def vni_of(counter: int) -> int:
    """The VNI of the ``counter``-th job (1..2^24-1, wrapping: old jobs are long gone)."""
    return (counter - 1) % MAX_VNI + 1


def vxlan_batch(device: str, bridge: str, vni: int, settings: OverlaySettings) -> str:
    """``ip -batch`` lines that make the job's VXLAN device and put it on its bridge."""
    return "\n".join(
        [
            f"link add {device} type vxlan id {vni} local {settings.address} "
            f"dstport {settings.port} nolearning",
            f"link set {device} mtu {settings.mtu}",
            f"link set {device} master {bridge}",
            f"link set {device} up",
            "",
        ]
    )


def fdb_changes(have: Iterable[str], want: Iterable[str]) -> tuple[list[str], list[str]]:
    """Peers to add and to remove so the device forwards to exactly ``want`` (pure)."""
    have, want = set(have), set(want)
    return sorted(want - have), sorted(have - want)


def fdb_argv(device: str, peer: str, *, add: bool) -> list[str]:
    """The ``bridge`` command that adds or removes one peer's all-zero forwarding entry."""
    verb = "append" if add else "del"
    return ["bridge", "fdb", verb, ALL_ZERO_MAC, "dev", device, "dst", peer]


def peers_in(fdb_show: str) -> set[str]:
    """The peers of ``bridge fdb show dev <vxlan>``'s all-zero entries."""
    out = set()
    for line in fdb_show.splitlines():
        words = line.split()
        if words[:1] == [ALL_ZERO_MAC] and "dst" in words:
            out.add(words[words.index("dst") + 1])
    return out


def job_network_key(job: str) -> str:
    """The Redis hash of a job's network: its node addresses (``n:<node>`` and their
    counter, ``workers.agent.network``), its VNI and the hosts it is on (here)."""
    return f"agent:net:{job}"


class OverlayRegistry:
    """Each job's VNI and the hosts it is on, in the agents' Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def vni(self, job: str) -> int:
        """``job``'s VNI: the one recorded, else a new one (the first recorded is everyone's)."""
        found = self.client.hget(job_network_key(job), "vni")
        if found is None:
            self.client.hsetnx(
                job_network_key(job), "vni", vni_of(int(self.client.incr(VNI_COUNTER)))
            )
            found = self.client.hget(job_network_key(job), "vni")
        return int(found)  # type: ignore[arg-type]

    def join(self, job: str, address: str) -> None:
        """This host has a namespace of ``job``."""
        self.client.hset(job_network_key(job), f"h:{address}", 1)

    def leave(self, job: str, address: str) -> None:
        """This host has none of ``job``'s namespaces any more."""
        self.client.hdel(job_network_key(job), f"h:{address}")

    def hosts(self, job: str) -> set[str]:
        """Every host ``job`` is on."""
        fields = self.client.hkeys(job_network_key(job))
        names = (f.decode() if isinstance(f, bytes) else str(f) for f in fields)
        return {name[2:] for name in names if name.startswith("h:")}
