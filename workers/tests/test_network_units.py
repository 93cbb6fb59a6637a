"""The pure parts of a job's network (names, addresses, endpoints) and the agent's forwarder."""

from __future__ import annotations

import ipaddress
import socket
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from workers.agent.config import AgentConfigError, AgentEnvironment
from workers.agent.forward import Forwarder, Upstream, socket_url
from workers.agent.network import (
    NetworkError,
    allocate,
    host_batch,
    inside_batch,
    net_names,
    node_address,
)


def test_names_fit_the_kernels_interface_limit_and_differ_per_node_but_not_bridge() -> None:
    long_job = "job-" + "x" * 200
    one, other = net_names("node-0", long_job), net_names("node-1", long_job)
    for names in (one, other):
        for interface in (names.bridge, names.host_veth, names.peer_veth):
            assert len(interface) <= 15, interface
    assert one.bridge == other.bridge  # one bridge per job on a host
    assert one.namespace != other.namespace and one.host_veth != other.host_veth
    assert net_names("node-0", "job-1").bridge != net_names("node-0", "job-2").bridge


def test_node_addresses_stay_inside_the_subnet() -> None:
    subnet = ipaddress.IPv4Network("10.77.0.0/30")
    assert str(node_address(subnet, 1)) == "10.77.0.1/30"
    assert str(node_address(subnet, 2)) == "10.77.0.2/30"
    for bad in (0, 3, 4):  # the network, the broadcast, past the end
        with pytest.raises(NetworkError):
            node_address(subnet, bad)


def test_the_host_side_has_no_address_and_the_bridge_is_made_once() -> None:
    names = net_names("n", "j")
    made = host_batch(names, make_bridge=True)
    joined = host_batch(names, make_bridge=False)
    assert f"link add {names.bridge} type bridge" in made
    assert "type bridge" not in joined
    assert "addr" not in made and "addr" not in joined
    inside = inside_batch(names, ipaddress.IPv4Interface("10.77.0.3/16"))
    assert "addr add 10.77.0.3/16 dev eth0" in inside and "link set lo up" in inside


def test_every_agent_gets_the_same_address_for_a_node_and_different_nodes_differ() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    job = f"net-units-{time.time_ns()}"
    try:
        first = allocate(client, job, "node-a")
        assert allocate(client, job, "node-a") == first
        assert allocate(client, job, "node-b") != first
    finally:
        client.delete(f"agent:net:{job}")


def test_a_socket_url_keeps_the_jobs_credentials_and_database() -> None:
    url = socket_url("redis://edl-job-1:p%40ss@127.0.0.1:6379/3", Path("/run/x/redis.sock"))
    assert url == "unix://edl-job-1:p%40ss@/run/x/redis.sock?db=3"
    parsed = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    assert parsed["password"] == "p@ss" and parsed["db"] == 3
    assert parsed["path"] == "/run/x/redis.sock"


def test_bad_network_settings_are_refused() -> None:
    base = {"REDIS_URL": "redis://127.0.0.1:6379/0", "AGENT_KEY": "00" * 32}
    for name, value in (
        ("SANDBOX_NETWORK", "bridge"),
        ("SANDBOX_SUBNET", "10.0.0.0/31"),
        ("SANDBOX_SUBNET", "not a subnet"),
    ):
        with pytest.raises(AgentConfigError, match=name):
            AgentEnvironment.read({**base, name: value})


def test_the_forwarder_carries_redis_and_caps_a_jobs_connections(tmp_path: Path) -> None:
    forwarder = Forwarder(max_connections=2)
    path = tmp_path / "redis.sock"
    forwarder.open_unix("job", path, None, Upstream.from_url(settings.REDIS_URL))
    try:
        url = socket_url(str(settings.REDIS_URL), path)
        first = redis.Redis.from_url(url)
        assert first.ping() is True
        second = socket.socket(socket.AF_UNIX)
        second.connect(str(path))
        third = socket.socket(socket.AF_UNIX)
        third.connect(str(path))
        third.settimeout(5)
        assert third.recv(1) == b""  # over the cap: closed at once
        second.close()
        third.close()
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        forwarder.close("job")
    assert not path.exists()
