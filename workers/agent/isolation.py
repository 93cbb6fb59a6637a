"""What a job's processes on this node get of the network: its namespace and Redis socket.

The glue between the process table and ``network`` / ``forward``: on first
use per job it makes the job's namespace, the Unix socket its programs reach
Redis through and, with an ``s3://`` store, the door to the store's endpoint
inside the namespace (``store_door``); it tells a launch what to add
(variables, the socket's directory, an ``/etc/hosts`` naming the endpoint,
the step that joins the namespace) and removes all of it once the job has
nothing left on the node.

``SANDBOX_NETWORK=job`` (the default) isolates sandboxed programs of a root
agent; an agent that is not root cannot make namespaces, so its programs keep
the host's network (logged once), as they do with ``SANDBOX_NETWORK=host`` or
``SANDBOX=off``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import redis

from workers.agent.config import AgentConfig, local_store_dir
from workers.agent.forward import Forwarder, Upstream, socket_url
from workers.agent.network import (
    JobNetwork,
    JobNetworks,
    NetworkError,
    join_namespace,
    program_variables,
)
from workers.agent.sandbox import Identity

log = logging.getLogger(__name__)


def isolates(config: AgentConfig, euid: int | None = None) -> bool:
    """Whether this agent gives each job its own network (see the module docstring)."""
    settings = config.sandbox
    if settings.mode != "on" or settings.network != "job":
        return False
    if (os.geteuid() if euid is None else euid) != 0:
        log.warning(
            "SANDBOX_NETWORK=job needs a root agent: programs share the host's network here"
        )
        return False
    return True


class NetworkIsolation:
    """This node's job networks and Redis sockets (an adapter: ``ip``, sockets, Redis)."""

    def __init__(self, config: AgentConfig, client: redis.Redis) -> None:
        self.enabled = isolates(config)
        self.config = config
        self.networks = JobNetworks(config.node, client, config.sandbox.subnet)
        self.forwarder = Forwarder()
        self.redis = Upstream.from_url(config.redis_url)
        self._made: dict[str, JobNetwork] = {}
        self._hosts: dict[str, Path | None] = {}
        """Per job, the ``/etc/hosts`` its store door made (None: it has no door)."""

    def network(self, job: str) -> JobNetwork:
        """``job``'s network here, made on first use (and again after an agent restart)."""
        made = self._made.get(job)
        if made is None:
            made = self._made[job] = self.networks.ensure(job)
        return made

    def redis_url(self, job: str, job_url: str, owner: Identity | None) -> str:
        """The URL ``job``'s programs reach their Redis user at: ``job_url`` itself on the
        host's network, else the job's forwarded socket (opened here, for ``owner``)."""
        if not self.enabled:
            return job_url
        return socket_url(job_url, self._open_redis(job, owner))

    def _open_redis(self, job: str, owner: Identity | None) -> Path:
        """Open ``job``'s Redis socket (for ``owner`` alone) if it is not open; its path."""
        path = self.network(job).redis_socket
        ids = (owner.uid, owner.gid) if owner is not None else None
        self.forwarder.open_unix(job, path, ids, self.redis)
        return path

    def store_door(self, job: str, store_env: Mapping[str, str]) -> Path | None:
        """Let ``job``'s namespace reach the object store that ``store_env`` (the ``AWS_*``
        variables its programs get) names; return the ``/etc/hosts`` to show them, which
        names the endpoint at its address inside the namespace (None: nothing to reach).
        Made once per job here: later workers of the job reuse it."""
        if not self.enabled or not store_env or local_store_dir(self.config.artifact_url):
            return None
        if job not in self._hosts:
            self._hosts[job] = self._open_store_door(job, store_env)
        return self._hosts[job]

    def _open_store_door(self, job: str, store_env: Mapping[str, str]) -> Path:
        network = self.network(job)
        lines = []
        for name, port in store_endpoints(self.config.artifact_url, store_env):
            address = _resolve(name)
            if ipaddress.IPv4Address(address) in self.networks.subnet:
                raise NetworkError(f"the store's {name} ({address}) lies in SANDBOX_SUBNET")
            self.networks.add_address(job, address)
            self.forwarder.open_in_namespace(
                job, network.namespace_file, address, port, Upstream(host=address, port=port)
            )
            if name != address:
                lines.append(f"{address} {name}\n")
        hosts = network.socket_dir / "hosts"
        hosts.write_text(_host_hosts() + "".join(lines))
        hosts.chmod(0o644)
        return hosts

    def master_addr(self, job: str, master_node: str, given: str) -> str:
        """Rank 0's address for a torchrun program: its node's address in the job's network
        (``given``, the node's host address, on the host's network)."""
        if not self.enabled or not master_node:
            return given
        return str(self.networks.address_of(job, master_node).ip)

    def variables(self) -> dict[str, str]:
        """What every program of an isolated job is told (its communicators' interface)."""
        return program_variables() if self.enabled else {}

    def read_only(self, job: str) -> tuple[Path, ...]:
        """What the sandbox must show of the network's files: the Redis socket's directory,
        where the job has a Redis user (a torchrun program has none)."""
        if not self.enabled:
            return ()
        network = self.network(job)
        if not self.forwarder.serves(job, str(network.redis_socket)):
            return ()
        return (network.socket_dir,)

    def joining(self, job: str, then: Callable[[], None]) -> tuple[Callable[[], None], int | None]:
        """A child's step between fork and exec that enters ``job``'s namespace, then runs
        ``then``; and the descriptor it needs, which the caller closes after the start."""
        if not self.enabled:
            return then, None
        fd = os.open(self.network(job).namespace_file, os.O_RDONLY | os.O_CLOEXEC)
        enter = join_namespace(fd)

        def step() -> None:
            enter()
            then()

        return step, fd

    def adopt(
        self, job: str, owner: Identity | None, redis: bool, store_env: Mapping[str, str]
    ) -> None:
        """Serve an adopted process's job again (a restarted agent): its namespace (made
        again if the host lost it), its Redis socket (``redis``) and store door."""
        if not self.enabled:
            return
        self.network(job)
        if redis:
            self._open_redis(job, owner)
        self.store_door(job, store_env)

    def release(self, job: str) -> None:
        """Remove ``job``'s socket and namespace here (nothing of it runs on this node)."""
        self.forwarder.close(job)
        self._made.pop(job, None)
        self._hosts.pop(job, None)
        if self.enabled:
            self.networks.release(job)

    def release_leftovers(self, busy: set[str]) -> None:
        """Remove the networks here of jobs with no process or stop in progress (``busy``):
        what an agent that died before settling them left."""
        if not self.enabled:
            return
        for job in self.networks.jobs_here():
            if job not in busy:
                self.release(job)


def store_endpoints(artifact_url: str, store_env: Mapping[str, str]) -> list[tuple[str, int]]:
    """The (host, port) pairs a runtime's S3 client may connect to for ``artifact_url``.

    The configured endpoint (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``), else
    AWS's regional and global ones, each also with the bucket in front
    (virtual-hosted addressing).
    """
    bucket = urlsplit(artifact_url).netloc
    given = store_env.get("AWS_ENDPOINT_URL_S3") or store_env.get("AWS_ENDPOINT_URL")
    if given:
        parts = urlsplit(given)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        hosts = [host]
    else:
        region = store_env.get("AWS_REGION") or store_env.get("AWS_DEFAULT_REGION") or "us-east-1"
        hosts, port = [f"s3.{region}.amazonaws.com", "s3.amazonaws.com"], 443
    named = [h for h in hosts if not _is_address(h)]
    return [(h, port) for h in hosts] + [(f"{bucket}.{h}", port) for h in named if bucket]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _resolve(host: str) -> str:
    """``host``'s first IPv4 address, as the agent sees it (pinned for the job's life here)."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError) as exc:
        raise NetworkError(f"cannot resolve the store's endpoint {host}: {exc}") from None


def _host_hosts() -> str:
    """The host's own ``/etc/hosts``, which the sandbox's copy starts from."""
    try:
        text = Path("/etc/hosts").read_text()
    except OSError:
        return "127.0.0.1 localhost\n"
    return text if text.endswith("\n") else text + "\n"
