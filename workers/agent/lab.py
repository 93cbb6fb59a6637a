"""The labs this agent serves: one relay per running session worker of rank 0.

``Labs.sync`` runs on each supervision pass (``Agent.tick``) with the process table's
records: a session's lab worker that runs gets a ``LabRelay`` (its token read from the
agent's own keys, ``LabTokens``), one that has gone loses it.  Each relay's reading of
Jupyter's status becomes a ``LabActivity`` report.

Tokens live in ``agent:<node>:lab-tokens`` (the agent's own key space, which no job's
Redis user reaches): made at the lab's start (``LabTokens.issue``), read again by an agent
that restarted and adopted the lab, dropped when the lab goes.  They never leave the node.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis

from workers.agent import homes
from workers.agent.config import AgentConfig
from workers.agent.home_plan import Base
from workers.agent.lab_launch import new_token
from workers.agent.lab_relay import LabRelay, LabStatus
from workers.agent.store import WorkerRecord
from workers.artifacts import ArtifactStore
from workers.elastic.redis_client import connect
from workers.lab_protocol import ACTIVITY_EVERY_S, base_url_of
from workers.protocol import LabActivity, Program, Report

log = logging.getLogger(__name__)

SESSION = "session"
MIB = 1024 * 1024


def is_lab(record: WorkerRecord) -> bool:
    """Whether ``record`` is the worker that runs a session's JupyterLab (its rank 0)."""
    return record.launcher == SESSION and (record.rank or 0) == 0


class LabTokens:
    """The labs' tokens on this node, kept in the agent's own Redis keys."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.client = client
        self.key = f"agent:{node}:lab-tokens"

    def issue(self, job: str, worker_id: str) -> str:
        """A new token for the lab of ``job``/``worker_id`` (replacing an older one)."""
        token = new_token()
        self.client.hset(self.key, f"{job}/{worker_id}", token)
        return token

    def get(self, job: str, worker_id: str) -> str | None:
        value = self.client.hget(self.key, f"{job}/{worker_id}")
        return value.decode() if isinstance(value, bytes) else value

    def drop(self, job: str, worker_id: str) -> None:
        self.client.hdel(self.key, f"{job}/{worker_id}")


@dataclass(frozen=True)
class HomeRecord:
    """What a lab's home sync needs, kept from its restore (across an agent restart)."""

    prefix: str
    quota_bytes: int
    owner: tuple[int, int] | None
    base: str

    def encode(self) -> str:
        return json.dumps(
            {
                "prefix": self.prefix,
                "quota": self.quota_bytes,
                "owner": self.owner,
                "base": self.base,
            }
        )

    @classmethod
    def decode(cls, text: str | bytes) -> HomeRecord:
        raw = json.loads(text)
        owner = raw["owner"]
        return cls(
            prefix=str(raw["prefix"]),
            quota_bytes=int(raw["quota"]),
            owner=(int(owner[0]), int(owner[1])) if owner else None,
            base=str(raw["base"]),
        )


class LabHomes:
    """Each session's persistent home (``workers.agent.homes``): restored into the lab's
    HOME before Jupyter starts, synced back once the lab has gone (before the agent reports
    the session stopped, so that the user's next session finds every file)."""

    def __init__(self, client: redis.Redis, node: str, artifact_url: str) -> None:
        self.client = client
        self.key = f"agent:{node}:lab-homes"
        self.artifact_url = artifact_url

    def restore(
        self, job: str, worker_id: str, program: Program, home: Path, owner: tuple[int, int] | None
    ) -> str | None:
        """Fill ``home`` from ``program.home_prefix`` (within ``home_quota_mib``); what it
        did, in one line (None: the session has no persistent home here)."""
        if not (program.home_prefix and program.home_quota_mib > 0 and self.artifact_url):
            return None
        prefix = program.home_prefix.rstrip("/")
        quota = program.home_quota_mib * MIB
        result = homes.restore(ArtifactStore(self.artifact_url), prefix, home, quota, owner=owner)
        record = HomeRecord(prefix, quota, owner, result.base.encode())
        self.client.hset(self.key, f"{job}/{worker_id}", record.encode())
        log.info("lab of %s: %s", job, result.message)
        return result.message

    def sync(self, job: str, worker_id: str, home: Path) -> str | None:
        """Store ``home`` back as the user's home (None: it has none here)."""
        raw = self.client.hget(self.key, f"{job}/{worker_id}")
        if raw is None:
            return None
        record = HomeRecord.decode(raw)
        result = homes.sync(
            ArtifactStore(self.artifact_url),
            record.prefix,
            home,
            record.quota_bytes,
            owner=record.owner,
            base=Base.decode(record.base),
        )
        if result.manifest_written or result.error is None:
            self.client.hdel(self.key, f"{job}/{worker_id}")
        log.info("lab of %s: %s", job, result.message)
        return result.message


class Labs:
    """The relays of the session labs that run on this node."""

    def __init__(
        self,
        config: AgentConfig,
        send: Callable[[Report], object],
        *,
        activity_every_s: float = ACTIVITY_EVERY_S,
        on_gone: Callable[[WorkerRecord], object] = lambda record: None,
    ) -> None:
        self.config = config
        self._send = send
        self.activity_every_s = activity_every_s
        self.on_gone = on_gone
        """Called for a lab whose worker has gone, before the agent settles its job: its
        home's sync."""
        self.relays: dict[str, tuple[WorkerRecord, LabRelay]] = {}
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        """A client of the agent's Redis that keeps bytes as bytes (bodies are not text)."""
        if self._client is None:
            self._client = connect(self.config.redis_url, decode_responses=False)
        return self._client

    @property
    def tokens(self) -> LabTokens:
        return LabTokens(self.client, self.config.node)

    def sync(self, records: Iterable[WorkerRecord]) -> None:
        """A relay for every lab in ``records``, none for a lab that has gone."""
        running = {record.key: record for record in records if is_lab(record)}
        for key in list(self.relays):
            if key not in running:
                self._end(key)
        for key, record in running.items():
            if key not in self.relays:
                self._serve(record)

    def _serve(self, record: WorkerRecord) -> None:
        try:
            token = self.tokens.get(record.job, record.worker_id)
            base_url = base_url_of(record.job)
        except (redis.RedisError, ValueError) as exc:
            log.warning("lab of %s: not served: %s", record.job, exc)
            return
        if token is None:
            log.warning("lab of %s/%s has no token here: not served", record.job, record.worker_id)
            return
        relay = LabRelay(
            self.client,
            node=self.config.node,
            job=record.job,
            job_dir=Path(self.config.job_dir(record.job)),
            worker_id=record.worker_id,
            token=token,
            base_url=base_url,
            on_activity=functools.partial(self.report, record.job),
            activity_every_s=self.activity_every_s,
        )
        try:
            relay.start()
        except redis.RedisError as exc:  # tried again at the next pass
            log.warning("lab of %s: not served yet: %s", record.job, exc)
            return
        self.relays[record.key] = (record, relay)
        log.info("serving the lab of %s/%s", record.job, record.worker_id)

    def _end(self, key: str) -> None:
        record, relay = self.relays.pop(key)
        relay.stop()
        try:
            self.tokens.drop(record.job, record.worker_id)
        except redis.RedisError:
            log.exception("lab of %s: its token stays in Redis", record.job)
        try:
            self.on_gone(record)
        except Exception:  # a store that is down must not take the agent with it
            log.exception("lab of %s: its home was not synced", record.job)
        log.info("the lab of %s/%s has gone", record.job, record.worker_id)

    def report(self, job: str, status: LabStatus) -> None:
        """Tell the portal what the lab of ``job`` did last."""
        try:
            self._send(
                LabActivity(
                    node=self.config.node,
                    job=job,
                    last_activity=status.last_activity,
                    connections=status.connections,
                    kernels=status.kernels,
                )
            )
        except Exception:  # a report that cannot go now goes with the next poll
            log.exception("lab of %s: its activity was not reported", job)

    def close(self) -> None:
        """Stop every relay (the agent stops; the labs themselves run on)."""
        for _key, (_record, relay) in list(self.relays.items()):
            relay.stop()
        self.relays.clear()
