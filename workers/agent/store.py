"""What an agent remembers in Redis, so that a restarted agent knows it too.

Keys (``<node>`` is the agent's node name)::

    agent:<node>:applied        sorted set: command ids applied, scored by time
    agent:<node>:workers        hash "<job>/<worker>" -> JSON of a WorkerRecord
    agent:<node>:stopping       hash job -> JSON {command_id, deadline}
    agent:<node>:cursor         hash job -> id of the last runtime event read
    agent:forwarded:<job>:<id>  one runtime event claimed by the agent that forwards it

The forwarded claims are shared by all agents: a job spread over several
nodes is tailed by each of them, and the first to claim an event sends it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from workers.elastic.redis_client import DEFAULT_OUTAGE_S, connect

APPLIED_TTL_SECONDS = 7 * 24 * 3600
"""How long a command id is remembered (a replay later than that is applied again)."""

FORWARD_CLAIM_TTL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class WorkerRecord:
    """A training process the agent started (its desired state: running).

    A tenant program's process also has ``launcher`` (``edl`` or
    ``torchrun``; None for a built-in workload), its ``rank`` and the job's
    ``generation``; ``sandboxed`` says ``pid`` is bubblewrap's, ``cgroups``
    names its cgroups by controller (removed once it exits), ``store_prefix`` is
    the job's prefix in the artifact store, ``code`` the bundle a program was
    started from (kept on the node while it runs), and ``start_ticks`` (the
    kernel's start time of ``pid``) lets a restarted agent recognise it
    without reading its command line.  Records written before these fields
    existed load with the defaults.
    """

    job: str
    worker_id: str
    slot: int
    pid: int
    log_path: str
    started_at: float
    rank: int | None = None
    generation: int | None = None
    launcher: str | None = None
    sandboxed: bool = False
    start_ticks: int | None = None
    cgroups: dict[str, str] | None = None
    store_prefix: str | None = None
    code: str | None = None
    environment: str | None = None
    """The key of the environment a program runs in (kept on the node while it runs)."""

    @property
    def key(self) -> str:
        return f"{self.job}/{self.worker_id}"


@dataclass(frozen=True)
class StopRecord:
    """A job the agent was told to stop, and when it ends the stragglers itself.

    SIGTERM goes out at ``deadline``, SIGKILL ``kill_after`` seconds later
    (None: the agent's ``stop_kill_after_seconds``).
    """

    command_id: str
    deadline: float
    kill_after: float | None = None


class AgentStore:
    """The agent's Redis-backed memory."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.redis = client
        self.node = node
        self._prefix = f"agent:{node}:"

    @classmethod
    def from_url(cls, url: str, node: str) -> AgentStore:
        """A store on the Redis at ``url``."""
        return cls(connect(url, outage_s=DEFAULT_OUTAGE_S), node)

    # commands ---------------------------------------------------------------
    def was_applied(self, command_id: str) -> bool:
        """Whether a command with this id was applied already."""
        return self.redis.zscore(self._prefix + "applied", command_id) is not None

    def mark_applied(self, command_id: str) -> None:
        """Remember the command id (and forget ids older than ``APPLIED_TTL_SECONDS``)."""
        now = time.time()
        key = self._prefix + "applied"
        pipe = self.redis.pipeline()
        pipe.zadd(key, {command_id: now})
        pipe.zremrangebyscore(key, "-inf", now - APPLIED_TTL_SECONDS)
        pipe.execute()

    # workers ------------------------------------------------------------------
    def save_worker(self, record: WorkerRecord) -> None:
        self.redis.hset(self._prefix + "workers", record.key, json.dumps(asdict(record)))

    def drop_worker(self, job: str, worker_id: str) -> None:
        self.redis.hdel(self._prefix + "workers", f"{job}/{worker_id}")

    def workers(self) -> list[WorkerRecord]:
        """Every process the agent believes it runs."""
        raw: Any = self.redis.hgetall(self._prefix + "workers")
        return [WorkerRecord(**json.loads(value)) for value in raw.values()]

    # stopping jobs ----------------------------------------------------------------
    def save_stop(self, job: str, record: StopRecord) -> None:
        self.redis.hset(self._prefix + "stopping", job, json.dumps(asdict(record)))

    def drop_stop(self, job: str) -> None:
        self.redis.hdel(self._prefix + "stopping", job)

    def stops(self) -> dict[str, StopRecord]:
        raw: Any = self.redis.hgetall(self._prefix + "stopping")
        return {job: StopRecord(**json.loads(value)) for job, value in raw.items()}

    # event cursors ------------------------------------------------------------------
    def save_cursor(self, job: str, event_id: str) -> None:
        self.redis.hset(self._prefix + "cursor", job, event_id)

    def drop_cursor(self, job: str) -> None:
        self.redis.hdel(self._prefix + "cursor", job)

    def cursors(self) -> dict[str, str]:
        raw: Any = self.redis.hgetall(self._prefix + "cursor")
        return dict(raw)

    def claim_event(self, job: str, event_id: str) -> bool:
        """True for the one agent that gets to forward this runtime event."""
        key = f"agent:forwarded:{job}:{event_id}"
        claimed: Any = self.redis.set(key, self.node, nx=True, ex=FORWARD_CLAIM_TTL_SECONDS)
        return bool(claimed)
