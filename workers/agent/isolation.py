"""What a job's processes on this node get of the network: its namespace and Redis socket.

The glue between the process table and ``network`` / ``forward``: on first
use per job it makes the job's namespace and the Unix socket its programs
reach Redis through; it tells a launch what to add (variables, the socket's
directory, the step that joins the namespace) and removes all of it once the
job has nothing left on the node.  (The artifact store is reached through
the agent's store door, ``workers.agent.door``: a Unix socket too, so a
program needs no route to the store's endpoint.)

``SANDBOX_NETWORK=job`` (the default) isolates sandboxed programs of a root
agent; an agent that is not root cannot make namespaces, so its programs keep
the host's network (logged once), as they do with ``SANDBOX_NETWORK=host`` or
``SANDBOX=off``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import redis

from workers.agent.config import AgentConfig
from workers.agent.forward import Forwarder, Upstream, socket_url
from workers.agent.network import (
    JobNetwork,
    JobNetworks,
    NetworkError,
    join_namespace,
    program_variables,
)
from workers.agent.overlay import OverlaySettings
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
        overlay = OverlaySettings(
            config.address, config.sandbox.vxlan_port, config.sandbox.overlay_mtu
        )
        self.networks = JobNetworks(config.node, client, config.sandbox.subnet, overlay=overlay)
        self.forwarder = Forwarder()
        self.redis = Upstream.from_url(config.redis_url)
        self._made: dict[str, JobNetwork] = {}

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

    def adopt(self, job: str, owner: Identity | None, redis: bool) -> None:
        """Serve an adopted process's job again (a restarted agent): its namespace (made
        again if the host lost it) and its Redis socket (``redis``)."""
        if not self.enabled:
            return
        self.network(job)
        if redis:
            self._open_redis(job, owner)

    def release(self, job: str) -> None:
        """Remove ``job``'s socket and namespace here (nothing of it runs on this node)."""
        self.forwarder.close(job)
        self._made.pop(job, None)
        if self.enabled:
            self.networks.release(job)

    def sync(self) -> None:
        """Bring each job's VXLAN here in line with the hosts it is on (every pass: a host
        that joined the job is reached within one)."""
        if not self.enabled:
            return
        for job in list(self._made):
            try:
                self.networks.sync(job)
            except (NetworkError, redis.RedisError):
                log.warning("could not bring job %s's VXLAN up to date", job, exc_info=True)

    def release_leftovers(self, busy: set[str]) -> None:
        """Remove the networks here of jobs with no process or stop in progress (``busy``):
        what an agent that died before settling them left."""
        if not self.enabled:
            return
        for job in self.networks.jobs_here():
            if job not in busy:
                self.release(job)
