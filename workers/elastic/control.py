"""The control API of one elastic job, for the node agent and the portal.

``JobControl`` talks to the job's workers only through Redis (keys under
``edl:{job_id}:``): requests go into the ``control`` stream, which the job's
leader reads between mini-batches; the leader answers through the job's
metadata hash (``status()``) and the ``events`` stream (``read_events()``).
No call here blocks on the training processes, so a replayed request is
harmless for the idempotent ones (stop, scale-in of workers already gone are
ignored by the leader).

Pairing of a migration: ``request_migration(leaving, joiners=n)`` tells the
leader to wait until ``n`` (default ``len(leaving)``) newcomers have
registered, then to switch once: the leavers leave and the joiners join at the
same mini-batch. The agent starts the joiner processes itself (as ordinary
newcomers, without ``--initial-world``) right after the request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from workers.elastic.keys import JobKeys
from workers.elastic.redis_client import CONTROL_OUTAGE_S, connect
from workers.elastic.redis_io import hash_fields, read_stream, text_or_none
from workers.runtime_events import RuntimeEvent

EVENTS_MAXLEN = 10_000
"""About how many entries a job's event stream keeps (Redis trims the oldest)."""


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of a job as its leader last wrote it.

    ``state`` is one of ``starting`` (no leader has written yet), ``running``,
    ``scaling``, ``recovering``, ``profiling``, ``stopping``, ``finished``,
    ``stopped``. A worker that cannot go on reports a ``failed`` event and
    exits non-zero; whether that fails the job is the agent's call. ``throughput_curve`` maps a worker count to samples/s once a
    profile has run (empty before).
    """

    generation: int = -1
    members: tuple[str, ...] = ()
    leader: str | None = None
    step: int = 0
    epoch: int = 0
    samples_per_s: float = 0.0
    last_loss: float = math.nan
    state: str = "starting"
    throughput_curve: dict[int, float] = field(default_factory=dict)


class JobControl:
    """Requests to, and observations of, one elastic job through Redis."""

    def __init__(self, redis_url: str, job_id: str, outage_s: float = CONTROL_OUTAGE_S) -> None:
        if not job_id or any(c in job_id for c in " :{}\n"):
            raise ValueError(f"invalid job id {job_id!r}")
        self.job_id = job_id
        self.keys = JobKeys(job_id)
        self.redis = connect(redis_url, outage_s=outage_s)

    # requests -----------------------------------------------------------------
    def _send(self, kind: str, **payload: Any) -> str:
        return str(
            self.redis.xadd(self.keys.control, {"kind": kind, "payload": json.dumps(payload)})
        )

    def request_scale_in(self, worker_ids: list[str], reason: str) -> None:
        """Ask the listed workers to leave at an agreed future mini-batch (graceful)."""
        self._send("scale_in", workers=list(worker_ids), reason=reason)

    def request_stop(self, reason: str) -> None:
        """Ask every worker to exit at an agreed mini-batch after a checkpoint."""
        self._send("stop", reason=reason)

    def request_migration(
        self, leaving: list[str], reason: str, joiners: int | None = None
    ) -> None:
        """Replace ``leaving`` by ``joiners`` newcomers (default as many) in one switch."""
        count = len(leaving) if joiners is None else joiners
        if count < 0:
            raise ValueError("joiners must be >= 0")
        self._send("migrate", workers=list(leaving), joiners=count, reason=reason)

    def set_rank_order(self, worker_ids: list[str]) -> None:
        """Order the job's next generations by ``worker_ids`` (the allocation's rank order).

        Sent before the membership request it belongs to: the leader reads the
        stream in order, replaces the job's ranks with this order, and the
        request's generation (survivors included) follows it. Workers not named
        are unranked (last, in their current order).
        """
        self._send("rank_order", workers=list(worker_ids))

    def announce_joiners(self, worker_ids: list[str]) -> None:
        """Tell the leader to batch the listed newcomers into one scale-out switch.

        The leader then holds those that register first until the others have
        too (at most ``leader.JOIN_BATCH_WAIT_S``).  Without it, and without a
        rank order naming them (``set_rank_order``), each newcomer is admitted
        as it registers.
        """
        self._send("joiners", workers=list(worker_ids))

    def request_profile(
        self, min_workers: int, max_workers: int, batches_per_level: int = 20
    ) -> None:
        """Measure samples/s from ``max_workers`` down to ``min_workers``, one worker at a time.

        The job must already run with ``max_workers`` (fewer: the profile starts
        at the current size). Workers removed by the profile exit (the agent
        sees them finish with status 0 and may reuse their slots). The curve
        arrives as a ``profile_done`` event and in ``status().throughput_curve``.
        """
        if not 1 <= min_workers <= max_workers:
            raise ValueError("need 1 <= min_workers <= max_workers")
        if batches_per_level < 2:
            raise ValueError("batches_per_level must be >= 2")
        self._send("profile", min=min_workers, max=max_workers, batches=batches_per_level)

    # observations ---------------------------------------------------------------
    def status(self) -> JobStatus:
        """The job's metadata as the leader last wrote it."""
        raw = hash_fields(self.redis, self.keys.meta)
        leader = text_or_none(self.redis.get(self.keys.leader))
        if not raw:
            return JobStatus(leader=leader)
        curve = {int(n): float(v) for n, v in json.loads(raw.get("curve", "{}")).items()}
        return JobStatus(
            generation=int(raw.get("generation", -1)),
            members=tuple(json.loads(raw.get("members", "[]"))),
            leader=leader,
            step=int(raw.get("step", 0)),
            epoch=int(raw.get("epoch", 0)),
            samples_per_s=float(raw.get("samples_per_s", 0.0)),
            last_loss=float(raw.get("last_loss", "nan")),
            state=raw.get("state", "starting"),
            throughput_curve=curve,
        )

    def read_events(
        self, last_id: str = "0", block_ms: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Runtime events after ``last_id``: ``[(id, {"kind": ..., **fields})]``.

        Pass the last id you saw to continue; ``block_ms`` waits that long for
        the first new event (None: do not wait).
        """
        out: list[tuple[str, dict[str, Any]]] = []
        for event_id, fields in read_stream(self.redis, self.keys.events, last_id, 1000, block_ms):
            body = json.loads(fields.get("data", "{}"))
            body["kind"] = fields.get("kind", "unknown")
            out.append((event_id, body))
        return out

    def cleanup(self) -> None:
        """Delete every key of the job (call after it finished or failed)."""
        batch: list[str] = []
        for key in self.redis.scan_iter(match=self.keys.prefix + "*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                self.redis.delete(*batch)
                batch.clear()
        if batch:
            self.redis.delete(*batch)


def publish(client: redis.Redis, keys: JobKeys, event: RuntimeEvent) -> None:
    """Append one runtime event to the job's stream: the one way the runtime writes it.

    The entry is the event's own (``RuntimeEvent.entry``, ``workers.runtime_events``).
    """
    entry: dict[FieldT, EncodableT] = dict(event.entry().items())
    client.xadd(keys.events, entry, maxlen=EVENTS_MAXLEN, approximate=True)
