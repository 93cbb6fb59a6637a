"""The job's metadata hash (``edl:{job}:meta``): what the leader writes and a successor reads.

Fields: ``cursor`` (control stream read up to), ``queue`` (requests not yet
carried out), ``curve`` and ``profile`` (a profile in progress), ``leader``,
``global_batch``, and per step ``step``, ``epoch``, ``samples_per_s``,
``last_loss``, ``generation``, ``members``, plus ``state``.  ``JobControl.status()``
reads the same hash.  What a successor reads back is checked like any
message: a bad queued request is dropped with a log line, not obeyed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from workers.elastic.constants import log
from workers.elastic.keys import JobKeys
from workers.elastic.messages import ControlRequest, ProfileState, request_from_dict
from workers.elastic.redis_io import hash_fields, set_fields
from workers.elastic.views import StepView
from workers.schema import ProtocolError


@dataclass
class LeaderMeta:
    """The leader's durable state, mirrored in the job's metadata hash."""

    client: redis.Redis
    keys: JobKeys
    me: str
    cursor: str = "0"
    queue: list[ControlRequest] = field(default_factory=list)
    curve: dict[str, float] = field(default_factory=dict)
    profile: ProfileState | None = None

    @classmethod
    def read(cls, client: redis.Redis, keys: JobKeys, me: str) -> LeaderMeta:
        """What the previous leader left (nothing for a new job)."""
        raw = hash_fields(client, keys.meta)
        meta = cls(client, keys, me, cursor=str(raw.get("cursor", "0")))
        try:
            queued = json.loads(raw.get("queue", "[]"))
            curve = json.loads(raw.get("curve", "{}"))
            profile = json.loads(raw.get("profile", "null"))
        except ValueError as exc:
            log(me, f"leader: unreadable metadata ignored: {exc}")
            return meta
        for item in queued if isinstance(queued, list) else []:
            try:
                meta.queue.append(request_from_dict(item))
            except ProtocolError as exc:
                log(me, f"leader: dropped a queued request: {exc}")
        if isinstance(curve, dict):
            meta.curve = {str(n): float(v) for n, v in curve.items()}
        if isinstance(profile, dict):
            try:
                meta.profile = ProfileState.from_fields(profile, "profile")
            except ProtocolError as exc:
                log(me, f"leader: dropped the profile in progress: {exc}")
        return meta

    def save(self, view: StepView, profile: ProfileState | None, generation: bool = True) -> None:
        """Write what a successor needs (and, if ``generation``, the current membership)."""
        mapping: dict[str, str | int | float] = {
            "cursor": self.cursor,
            "queue": json.dumps([request.to_dict() for request in self.queue]),
            "curve": json.dumps(self.curve),
            "profile": json.dumps(None if profile is None else profile.to_dict()),
            "leader": self.me,
            "global_batch": view.opts.batch_size,
        }
        if generation:
            mapping["generation"] = view.generation
            mapping["members"] = json.dumps(view.members)
        set_fields(self.client, self.keys.meta, mapping)

    def save_membership(self, generation: int, members: list[str]) -> None:
        """The membership after a switch this leader will not see (it leaves at it)."""
        set_fields(
            self.client, self.keys.meta, {"generation": generation, "members": json.dumps(members)}
        )

    def save_step(self, view: StepView, samples_per_s: float) -> None:
        """Progress after a committed mini-batch."""
        set_fields(
            self.client,
            self.keys.meta,
            {
                "step": view.step,
                "epoch": view.epoch,
                "samples_per_s": samples_per_s,
                "last_loss": view.last_loss,
                "generation": view.generation,
                "members": json.dumps(view.members),
                "global_batch": view.opts.batch_size,
            },
        )
