"""A job's network across hosts (``workers.agent.overlay``): its bridges joined by its own VXLAN.

The integration tests build two hosts on this machine: two network namespaces
joined by a veth pair (the underlay, 10.99.0.0/24), each running the real
``JobNetworks`` through ``ip netns exec`` (its ``ip`` and ``bridge`` commands
run in that host).  A job with a node on each host then talks across the
tunnel, a large transfer included (the overlay's MTU), and another job's
namespaces stay out of reach.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from workers.agent.config import AgentConfigError, AgentEnvironment
from workers.agent.network import JobNetworks, net_names, run_ip
from workers.agent.overlay import (
    OverlayRegistry,
    OverlaySettings,
    fdb_argv,
    fdb_changes,
    overlay_wanted,
    peers_in,
    vni_of,
    vxlan_batch,
)

# --------------------------------------------------------------------------- the rules


def test_only_an_agent_on_a_real_address_joins_hosts() -> None:
    assert overlay_wanted("10.0.0.5") and overlay_wanted("fd00::1")
    assert not overlay_wanted("127.0.0.1") and not overlay_wanted("::1")
    assert not overlay_wanted("node-3.example")  # a name: the agent cannot say, so no


def test_vnis_wrap_inside_vxlans_range() -> None:
    assert vni_of(1) == 1 and vni_of(2**24 - 1) == 2**24 - 1 and vni_of(2**24) == 1


def test_the_forwarding_entries_follow_the_hosts() -> None:
    assert fdb_changes({"10.0.0.2", "10.0.0.3"}, {"10.0.0.3", "10.0.0.4"}) == (
        ["10.0.0.4"],
        ["10.0.0.2"],
    )
    shown = (
        "00:00:00:00:00:00 dst 10.0.0.2 self permanent\n"
        "be:ef:00:00:00:01 master pjbx permanent\n"
        "00:00:00:00:00:00 dst 10.0.0.3 self permanent\n"
    )
    assert peers_in(shown) == {"10.0.0.2", "10.0.0.3"}
    assert fdb_argv("pjx1", "10.0.0.2", add=True)[:3] == ["bridge", "fdb", "append"]


def test_the_device_has_the_jobs_vni_no_learning_and_the_overlays_mtu() -> None:
    batch = vxlan_batch("pjx1", "pjb1", 77, OverlaySettings("10.0.0.1", 4790, 1400))
    assert "id 77 local 10.0.0.1 dstport 4790 nolearning" in batch
    assert "mtu 1400" in batch and "master pjb1" in batch


def test_bad_overlay_settings_are_refused() -> None:
    env = {"REDIS_URL": "redis://127.0.0.1:6379/0", "AGENT_NODE": "n", "AGENT_KEY": "00" * 32}
    read = AgentEnvironment.read({**env, "SANDBOX_VXLAN_PORT": "4790"})
    assert read.sandbox.vxlan_port == 4790 and read.sandbox.overlay_mtu == 1450
    for name, value in (("SANDBOX_VXLAN_PORT", "70000"), ("SANDBOX_OVERLAY_MTU", "100")):
        with pytest.raises(AgentConfigError, match=name):
            AgentEnvironment.read({**env, name: value})


def test_the_registry_gives_one_vni_per_job_and_lists_its_hosts(redis_url: str) -> None:
    registry = OverlayRegistry(redis.Redis.from_url(redis_url))
    job, other = f"ov-{uuid.uuid4().hex[:8]}", f"ov-{uuid.uuid4().hex[:8]}"
    first = registry.vni(job)
    assert registry.vni(job) == first and registry.vni(other) != first
    registry.join(job, "10.0.0.1")
    registry.join(job, "10.0.0.2")
    registry.leave(job, "10.0.0.1")
    assert registry.hosts(job) == {"10.0.0.2"}


# --------------------------------------------------------------------------- two hosts here

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("bridge") is None,
    reason="two hosts of network namespaces need root and iproute2",
)


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


class Host:
    """One simulated host: a network namespace with an underlay address."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address

    def run(self, argv: Sequence[str], batch: str) -> None:
        """``JobNetworks``' runner: host-side commands run in this host; making and
        removing named namespaces needs no host."""
        if list(argv[:2]) == ["ip", "netns"]:
            run_ip(argv, batch)
        else:
            run_ip(["ip", "netns", "exec", self.name, *argv], batch)

    def exists(self, interface: str) -> bool:
        return (
            subprocess.run(
                ["ip", "-n", self.name, "link", "show", interface], capture_output=True
            ).returncode
            == 0
        )

    def show(self, argv: Sequence[str]) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True
        )
        return done.stdout

    def networks(self, node: str, client: redis.Redis, root: Path) -> JobNetworks:
        return JobNetworks(
            node,
            client,
            run=self.run,
            run_root=root / node,
            overlay=OverlaySettings(self.address),
            exists=self.exists,
            show=self.show,
        )


@pytest.fixture
def two_hosts() -> Iterator[tuple[Host, Host]]:
    tag = uuid.uuid4().hex[:6]
    a, b = Host(f"ha{tag}", "10.99.0.1"), Host(f"hb{tag}", "10.99.0.2")
    for host in (a, b):
        _ip("netns", "add", host.name)
    _ip("link", "add", f"ua{tag}", "type", "veth", "peer", "name", f"ub{tag}")
    for host, end in ((a, f"ua{tag}"), (b, f"ub{tag}")):
        _ip("link", "set", end, "netns", host.name)
        _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", end)
        _ip("-n", host.name, "link", "set", end, "up")
        _ip("-n", host.name, "link", "set", "lo", "up")
    try:
        yield a, b
    finally:
        for host in (a, b):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", host.name)


def _in(namespace: str, code: str, timeout: float = 20.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


SERVER = """
import socket
server = socket.create_server(({address!r}, {port}))
server.settimeout({wait})
try:
    conn, _ = server.accept()
except TimeoutError:
    print("nobody came")
else:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    print("received", len(data))
"""

CLIENT = """
import socket
try:
    conn = socket.create_connection(({address!r}, {port}), timeout=5)
    conn.sendall(b"x" * {size})
    conn.close()
    print("sent")
except OSError as exc:
    print("refused", type(exc).__name__)
"""


@needs_root
def test_a_jobs_nodes_on_two_hosts_talk_over_its_vxlan_and_nothing_else_does(
    two_hosts: tuple[Host, Host], redis_url: str, tmp_path: Path
) -> None:
    a, b = two_hosts
    client = redis.Redis.from_url(redis_url)
    job, other = f"vx-{uuid.uuid4().hex[:8]}", f"vx-{uuid.uuid4().hex[:8]}"
    on_a, on_b = a.networks("node-a", client, tmp_path), b.networks("node-b", client, tmp_path)
    try:
        mine_a, mine_b = on_a.ensure(job), on_b.ensure(job)
        fdb = ["bridge", "fdb", "show", "dev", mine_a.names.vxlan]
        assert "10.99.0.2" not in a.show(fdb)  # a made its device before b joined ...
        on_a.sync(job)  # ... its next pass reaches b
        assert "dst 10.99.0.2" in a.show(fdb)
        # Another job on host b, whose second node has the address job's node-b has.
        b.networks("node-x", client, tmp_path).ensure(other)
        theirs = b.networks("node-y", client, tmp_path).ensure(other)
        assert mine_b.address.ip == theirs.address.ip  # 10.77.0.2 in both jobs

        size = 1_000_000  # far more than one frame: the overlay's MTU is right
        server = _in(mine_b.names.namespace, SERVER.format(address="10.77.0.2", port=5000, wait=15))
        spy = _in(theirs.names.namespace, SERVER.format(address="10.77.0.2", port=5001, wait=6))
        time.sleep(1.0)  # the two listeners are up
        sender = _in(
            mine_a.names.namespace, CLIENT.format(address="10.77.0.2", port=5000, size=size)
        )
        prober = _in(mine_a.names.namespace, CLIENT.format(address="10.77.0.2", port=5001, size=10))
        sent, _ = sender.communicate(timeout=30)
        got, _ = server.communicate(timeout=30)
        probed, _ = prober.communicate(timeout=30)
        spied, _ = spy.communicate(timeout=30)
        assert "sent" in sent and f"received {size}" in got, (sent, got)
        assert "refused" in probed  # reached job's own node-b, which has nothing on 5001
        assert "nobody came" in spied  # the other job's namespace heard nothing

        # b leaves the job: a stops forwarding to it at its next pass.
        on_b.release(job)
        on_a.sync(job)
        assert "10.99.0.2" not in a.show(fdb)
    finally:
        for node, name in (("node-a", job), ("node-b", job), ("node-x", other), ("node-y", other)):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", net_names(node, name).namespace)
