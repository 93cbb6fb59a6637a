"""A network of its own for each job: a namespace per (job, node) on a bridge per job.

What a sandboxed program's network is (``SANDBOX_NETWORK=job``, the default
under a root agent)::

    host (agent)                            namespace portal-<h(node, job)>
    ------------                            -------------------------------
    bridge pjb<h(job)>  (no address,        lo        127.0.0.1 (its own loopback)
      no IPv6)                              eth0      <SANDBOX_SUBNET>[index of the node]
      +-- veth pjv<h(node, job)>  <------>    (the veth's other end)
      +-- (the job's namespaces of the other agents on this host)

Every worker of a job on one node joins the same namespace (``join_namespace``,
between fork and exec, before bubblewrap runs), so local ranks talk over its
loopback; the job's namespaces on other agents of this host sit on the same
bridge, so ranks on other nodes answer on their ``eth0`` addresses.  The
bridge has no address of its own (and IPv6 is off on it and on the host's
veth ends), so nothing on the host answers: not the portal's web server,
PostgreSQL, the agents' Redis, other jobs (their bridges are not this one), or
the cloud's metadata address (there is no route out at all).

Addresses.  A node's address in a job is ``SANDBOX_SUBNET[index]``, the index
allocated once per (job, node) in Redis (``allocate``: ``HSETNX`` on a counter,
so every agent agrees on every node's address, including rank 0's for a
torchrun program's ``MASTER_ADDR``).  The whole subnet is each job's own: two
jobs never share a bridge, so their addresses may repeat.

What else crosses the boundary: the job's own Redis user, through a Unix
socket the agent forwards (``redis_forward``); ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` name ``eth0`` so the communicators advertise it.

Across hosts the job's bridges are joined by a VXLAN of the job's own
(``workers.agent.overlay``: its VNI and its hosts in Redis, each peer host in
the device's forwarding table), when the agent's ``AGENT_ADDRESS`` is a real
address; agents on loopback share one host's bridges and make none.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from workers.agent.overlay import (
    OverlayRegistry,
    OverlaySettings,
    fdb_argv,
    fdb_changes,
    job_network_key,
    peers_in,
    vxlan_batch,
)

NETNS_DIR = Path("/run/netns")
"""Where ``ip netns`` keeps named network namespaces (bind mounts of ``/proc/<pid>/ns/net``)."""
RUN_ROOT = Path("/run/portal-net")
"""Per-namespace directories of the agents (the Redis socket) and their lock file."""
INSIDE_INTERFACE = "eth0"
"""The job's interface in its namespace (the name communicators are told to use)."""
DEFAULT_SUBNET = "10.77.0.0/16"
CLONE_NEWNET = 0x40000000
OWNER_FILE = "owner.json"
"""In a namespace's directory: the node and job it belongs to (names are hashes)."""
KEY_TTL_S = 30 * 24 * 3600
"""How long a job's address map outlives its last start (refreshed on each)."""


class NetworkError(RuntimeError):
    """A job's network could not be made (its processes must not start without it)."""


@dataclass(frozen=True)
class NetNames:
    """The names of one (job, node)'s network objects; interface names fit in 15 bytes."""

    namespace: str
    bridge: str
    host_veth: str
    peer_veth: str
    vxlan: str


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def net_names(node: str, job: str) -> NetNames:
    """The namespace, bridge and veth names of ``job`` on ``node`` (hashes: any job id fits)."""
    own = _digest(node, job)
    return NetNames(
        namespace=f"portal-{own[:16]}",
        bridge=f"pjb{_digest(job)[:12]}",
        host_veth=f"pjv{own[:12]}",
        peer_veth=f"pjn{own[:12]}",
        vxlan=f"pjx{_digest(job)[:12]}",
    )


def node_address(subnet: ipaddress.IPv4Network, index: int) -> ipaddress.IPv4Interface:
    """The address (with the subnet's prefix) of the ``index``-th node of a job (from 1)."""
    if not 1 <= index < subnet.num_addresses - 1:
        raise NetworkError(f"subnet {subnet} has no address for a job's node number {index}")
    return ipaddress.IPv4Interface(f"{subnet[index]}/{subnet.prefixlen}")


def host_batch(names: NetNames, *, make_bridge: bool, mtu: int | None = None) -> str:
    """``ip -batch`` lines that make the job's bridge (unless another agent of this host
    has) and this node's veth pair on it, its other end moved into the namespace
    (``mtu``: the overlay's, when the job's frames may cross a VXLAN)."""
    bridge = [f"link add {names.bridge} type bridge", f"link set {names.bridge} up"]
    sized = [f"link set {names.host_veth} mtu {mtu}"] if mtu else []
    return "\n".join(
        [
            *(bridge if make_bridge else []),
            f"link add {names.host_veth} type veth peer name {names.peer_veth}",
            *sized,
            f"link set {names.host_veth} master {names.bridge}",
            f"link set {names.peer_veth} netns {names.namespace}",
            f"link set {names.host_veth} up",
            "",
        ]
    )


def inside_batch(names: NetNames, address: ipaddress.IPv4Interface, mtu: int | None = None) -> str:
    """``ip -n <namespace> -batch`` lines that configure the namespace's two interfaces."""
    sized = [f"link set {INSIDE_INTERFACE} mtu {mtu}"] if mtu else []
    return "\n".join(
        [
            f"link set {names.peer_veth} name {INSIDE_INTERFACE}",
            *sized,
            f"addr add {address} dev {INSIDE_INTERFACE}",
            f"link set {INSIDE_INTERFACE} up",
            "link set lo up",
            "",
        ]
    )


def program_variables() -> dict[str, str]:
    """What a program in a job's namespace is told so its communicators use ``eth0``."""
    return {"GLOO_SOCKET_IFNAME": INSIDE_INTERFACE, "NCCL_SOCKET_IFNAME": INSIDE_INTERFACE}


Runner = Callable[[Sequence[str], str], None]
"""Runs an ``ip`` command with a batch on its stdin; raises ``NetworkError`` on failure."""


def run_ip(argv: Sequence[str], batch: str) -> None:
    """The real ``Runner``: ``ip`` (or ``bridge``) with ``batch`` on stdin."""
    ip_output(argv, batch)


def ip_output(argv: Sequence[str], batch: str = "") -> str:
    """Run ``ip``/``bridge`` with ``batch`` on stdin; its output (NetworkError on failure)."""
    done = subprocess.run(
        list(argv), input=batch.encode(), capture_output=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode(errors="replace")


@dataclass(frozen=True)
class JobNetwork:
    """One job's network on this node, as made: its names, address and Redis socket."""

    names: NetNames
    address: ipaddress.IPv4Interface
    socket_dir: Path
    """The agent's directory of it, bound (read-only) into the sandbox: ``redis.sock``,
    the ``/etc/hosts`` of a store door, the owner and ready marks."""

    @property
    def namespace_file(self) -> Path:
        return NETNS_DIR / self.names.namespace

    @property
    def redis_socket(self) -> Path:
        return self.socket_dir / "redis.sock"


def allocate(client: redis.Redis, job: str, node: str) -> int:
    """The index of ``node``'s address in ``job``: the one recorded, else a new one.

    Any agent may ask for any node (a torchrun program's rank 0): the first
    answer recorded (``HSETNX``) is everyone's.
    """
    key, field = job_network_key(job), f"n:{node}"
    found = client.hget(key, field)
    if found is None:
        client.hsetnx(key, field, int(client.hincrby(key, "next", 1)))
        found = client.hget(key, field)
    client.expire(key, KEY_TTL_S)
    return int(found)  # type: ignore[arg-type]


@contextlib.contextmanager
def _host_lock(root: Path) -> Iterator[None]:
    """One agent at a time makes or removes bridges on this host (agents share bridges)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class JobNetworks:
    """The namespaces of this node's jobs (an adapter: ``ip``, ``/run/netns``, Redis).

    ``ensure`` is idempotent and survives an agent restart (the namespace is
    named, so it outlives the agent and is found again); ``release`` removes
    the namespace (and with it the veth) and the bridge once no namespace of
    this host is on it.
    """

    def __init__(
        self,
        node: str,
        client: redis.Redis,
        subnet: str = DEFAULT_SUBNET,
        *,
        run: Runner = run_ip,
        run_root: Path = RUN_ROOT,
        overlay: OverlaySettings | None = None,
        exists: Callable[[str], bool] | None = None,
        show: Callable[[Sequence[str]], str] = ip_output,
    ) -> None:
        self.node = node
        self.client = client
        self.subnet = ipaddress.IPv4Network(subnet)
        self.run = run
        self.run_root = run_root
        self.overlay = overlay if overlay is not None and overlay.enabled else None
        """Joins this host's bridges to the job's other hosts (None: one host)."""
        self.registry = OverlayRegistry(client)
        self.exists = exists or _interface_exists
        """Whether a host interface is there (``ip`` in another namespace, for tests)."""
        self.show = show
        self._peers: dict[str, set[str]] = {}
        """Each job's peer hosts as this agent last set them in its VXLAN device."""

    def address_of(self, job: str, node: str) -> ipaddress.IPv4Interface:
        """``node``'s address in ``job``'s network (allocated on first use)."""
        return node_address(self.subnet, allocate(self.client, job, node))

    def ensure(self, job: str) -> JobNetwork:
        """Make ``job``'s namespace on this node if it is not there; return it."""
        names = net_names(self.node, job)
        directory = self.run_root / names.namespace
        network = JobNetwork(names, self.address_of(job, self.node), directory)
        ready = directory / "ready"
        if ready.exists() and (NETNS_DIR / names.namespace).exists():
            return network
        mtu = self.overlay.mtu if self.overlay is not None else None
        with _host_lock(self.run_root):
            # A half-made namespace (an agent killed while making it) is made again.
            if (NETNS_DIR / names.namespace).exists():
                self.run(["ip", "netns", "del", names.namespace], "")
            if self.exists(names.host_veth):
                self.run(["ip", "link", "del", names.host_veth], "")
            self.run(["ip", "netns", "add", names.namespace], "")
            make_bridge = not self.exists(names.bridge)
            self.run(["ip", "-batch", "-"], host_batch(names, make_bridge=make_bridge, mtu=mtu))
            _no_ipv6(names.bridge)
            _no_ipv6(names.host_veth)
            self._join_hosts(job, names)
            inside = inside_batch(names, network.address, mtu)
            self.run(["ip", "-n", names.namespace, "-batch", "-"], inside)
            directory.mkdir(mode=0o755, exist_ok=True)
            (directory / OWNER_FILE).write_text(json.dumps({"node": self.node, "job": job}))
            ready.touch()
        self.sync(job)
        return network

    def _join_hosts(self, job: str, names: NetNames) -> None:
        """Put the job's VXLAN on its bridge here (once per host) and record this host."""
        if self.overlay is None:
            return
        if not self.exists(names.vxlan):
            vni = self.registry.vni(job)
            self.run(
                ["ip", "-batch", "-"], vxlan_batch(names.vxlan, names.bridge, vni, self.overlay)
            )
            _no_ipv6(names.vxlan)
            self._peers.pop(job, None)  # a new device forwards nowhere yet
        self.registry.join(job, self.overlay.address)

    def sync(self, job: str) -> None:
        """Forward ``job``'s frames to exactly its other hosts (the registry's): a host that
        joined since is reached, one that left is not (each pass, for jobs here)."""
        if self.overlay is None:
            return
        names = net_names(self.node, job)
        want = self.registry.hosts(job) - {self.overlay.address}
        have = self._peers.get(job)
        if have is None:
            have = peers_in(self.show(["bridge", "fdb", "show", "dev", names.vxlan]))
        if have == want:
            self._peers[job] = have
            return
        add, remove = fdb_changes(have, want)
        for peer in add:
            self.run(fdb_argv(names.vxlan, peer, add=True), "")
        for peer in remove:
            with contextlib.suppress(NetworkError):
                self.run(fdb_argv(names.vxlan, peer, add=False), "")
        self._peers[job] = want

    def jobs_here(self) -> list[str]:
        """The jobs this node has a namespace for (to remove those no process needs)."""
        return sorted(
            owner.job for owner in recorded_owners(self.run_root) if owner.node == self.node
        )

    def release(self, job: str) -> None:
        """Remove ``job``'s namespace here, and its bridge (and VXLAN) if no other agent's
        is on it: then this host leaves the job's hosts."""
        self._peers.pop(job, None)
        left = remove_network(net_names(self.node, job), run_root=self.run_root, run=self.run)
        if left and self.overlay is not None:
            self.registry.leave(job, self.overlay.address)


def remove_network(names: NetNames, *, run_root: Path = RUN_ROOT, run: Runner = run_ip) -> bool:
    """Remove one (job, node)'s namespace, veth and directory, and the job's bridge and VXLAN
    once no namespace of this host is on it (idempotent); True when the bridge went."""
    with _host_lock(run_root):
        shutil.rmtree(run_root / names.namespace, ignore_errors=True)
        # The veth first: a namespace's own interfaces go only once the kernel has
        # finished with it, later, and the bridge would look in use until then.
        if _interface_exists(names.host_veth):
            with contextlib.suppress(NetworkError):
                run(["ip", "link", "del", names.host_veth], "")
        if (NETNS_DIR / names.namespace).exists():
            with contextlib.suppress(NetworkError):
                run(["ip", "netns", "del", names.namespace], "")
        ports = Path("/sys/class/net") / names.bridge / "brif"
        if not ports.is_dir():
            return True
        if any(port.name != names.vxlan for port in ports.iterdir()):
            return False
        with contextlib.suppress(NetworkError):
            if _interface_exists(names.vxlan):
                run(["ip", "link", "del", names.vxlan], "")
            run(["ip", "link", "del", names.bridge], "")
        return True


def _interface_exists(name: str) -> bool:
    return (Path("/sys/class/net") / name).exists()


def _no_ipv6(interface: str) -> None:
    """Turn IPv6 off on a host-side interface: no link-local address the job could reach."""
    with contextlib.suppress(FileNotFoundError):
        Path(f"/proc/sys/net/ipv6/conf/{interface}/disable_ipv6").write_text("1")


_LIBC = ctypes.CDLL(None, use_errno=True)


def join_namespace(fd: int) -> Callable[[], None]:
    """What a child runs between fork and exec to enter the namespace open on ``fd``."""
    setns = _LIBC.setns

    def enter() -> None:
        if setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns: {os.strerror(code or errno.EINVAL)}")

    return enter


@dataclass(frozen=True)
class Owner:
    """Whose a namespace directory of this host is, as its owner file records it."""

    node: str
    job: str
    made_at: float


def recorded_owners(run_root: Path) -> list[Owner]:
    """The owners of this host's job networks (unreadable records are skipped)."""
    out = []
    for path in run_root.glob(f"portal-*/{OWNER_FILE}"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            recorded = json.loads(path.read_text())
            out.append(Owner(str(recorded["node"]), str(recorded["job"]), path.stat().st_mtime))
    return out


def remove_made_since(run_root: Path, since: float) -> None:
    """Remove the job networks of this host made after ``since`` that no process is in any
    more (a test session's end; another session's running jobs keep theirs)."""
    for owner in recorded_owners(run_root):
        names = net_names(owner.node, owner.job)
        if owner.made_at >= since and not _has_processes(names.namespace):
            with contextlib.suppress(OSError):
                remove_network(names, run_root=run_root)


def _has_processes(namespace: str) -> bool:
    done = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    )
    return done.returncode != 0 or bool(done.stdout.strip())
