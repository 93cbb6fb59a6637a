"""The messages of the elastic runtime: plans, requests, RPC and events, as frozen records.

Everything here crosses a thread or a process boundary through Redis, so
everything is checked on the way in (``workers.schema``): a malformed
message raises ``ProtocolError`` naming the field, never a ``KeyError``
deep inside the runtime.  The wire format is the JSON the runtime wrote as
plain dicts before: a ``kind`` key (``op`` for the RPC) and the fields.

::

    JobControl ──(control stream: ControlRequest, RankOrderRequest first)──▶ leader
    newcomer   ──(rpc list: Register)──────────────▶ leader ──(reply list: PreparePlan)──▶ newcomer
    leader     ──(plan:{n}: Plan = PreparePlan | SwitchPlan | StopPlan)──▶ every member
    leader     ──(recovery:{g}: RecoveryPlan)──────▶ survivors
    leader, workers ──(events stream: RuntimeEvent)──▶ agents
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import redis

from workers.elastic.control import emit_event
from workers.elastic.keys import JobKeys
from workers.outputs import (
    MAX_METRIC_POINTS,
    OutputError,
    check_metric_values,
    check_sha256,
)
from workers.outputs import check_job_path as check_output_path
from workers.schema import Message, ProtocolError, Record, at_least, parse

MAX_POINTS_PER_EVENT = MAX_METRIC_POINTS

RecoveryMode = Literal["consistent", "approximate"]


def _check_members(members: tuple[str, ...], path: str) -> None:
    if any(not m for m in members):
        raise ProtocolError(f"{path} must not contain an empty worker id")
    if len(set(members)) != len(members):
        raise ProtocolError(f"{path} repeats a worker")


def _load(raw: str | bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"a {what} is not JSON: {exc}") from None


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, kw_only=True)
class RuntimeMessage(Message):
    """A runtime message: its JSON names its type under ``kind``."""

    KEY: ClassVar[str] = "kind"


@dataclass(frozen=True, kw_only=True)
class PreparePlan(RuntimeMessage):
    """The next generation: every member builds its process group in the background.

    ``source`` is the rank (in ``members``) that sends the state to the
    joiners at the switch; ``handoff`` says no member stays, so the leaving
    leader leaves the state in Redis instead.
    """

    TYPE: ClassVar[str] = "prepare"
    generation: int
    base_generation: int
    members: tuple[str, ...]
    joiners: tuple[str, ...] = ()
    leavers: tuple[str, ...] = ()
    source: int = 0
    handoff: bool = False
    reason: str = ""

    def validate(self) -> None:
        at_least(self.generation, 0, f"{self.TYPE}.generation")
        if not self.members:
            raise ProtocolError(f"{self.TYPE}.members must not be empty")
        _check_members(self.members, f"{self.TYPE}.members")
        if not 0 <= self.source < len(self.members):
            raise ProtocolError(f"{self.TYPE}.source must be a rank of members")


@dataclass(frozen=True, kw_only=True)
class SwitchPlan(PreparePlan):
    """All members of a prepared generation are ready: switch ``k`` mini-batches after learning it."""

    TYPE: ClassVar[str] = "switch"
    k: int

    def validate(self) -> None:
        super().validate()
        at_least(self.k, 1, "switch.k")

    @classmethod
    def of(cls, plan: PreparePlan, k: int) -> SwitchPlan:
        """The switch of a prepared generation."""
        fields = plan.to_dict()
        del fields[cls.KEY]
        return cls(**fields, k=k)


@dataclass(frozen=True, kw_only=True)
class StopPlan(RuntimeMessage):
    """Every member stops ``k`` mini-batches after learning it (after a checkpoint)."""

    TYPE: ClassVar[str] = "stop"
    base_generation: int
    k: int
    reason: str | None = None

    def validate(self) -> None:
        at_least(self.k, 1, "stop.k")


Plan = PreparePlan | SwitchPlan | StopPlan
_PLANS: dict[str, type[Plan]] = {c.TYPE: c for c in (PreparePlan, SwitchPlan, StopPlan)}


def plan_from_json(raw: str | bytes) -> Plan:
    """Parse a published plan; raise ``ProtocolError`` if it is not one."""
    plan: Plan = parse(_load(raw, "plan"), _PLANS, "plan", key="kind")
    return plan


def plan_from_dict(data: Any) -> Plan:
    """Parse a plan given as a dict (one kept in a checkpoint's pending actions)."""
    plan: Plan = parse(data, _PLANS, "plan", key="kind")
    return plan


@dataclass(frozen=True, kw_only=True)
class RecoveryPlan(Record):
    """How the survivors of a failed generation go on (``recovery:{g}``)."""

    generation: int
    members: tuple[str, ...]
    mode: RecoveryMode
    plan_seq: int
    source: int
    step: int | None

    def validate(self) -> None:
        _check_members(self.members, "recovery.members")
        at_least(self.plan_seq, 0, "recovery.plan_seq")
        if self.members and not 0 <= self.source < len(self.members):
            raise ProtocolError("recovery.source must be a rank of members")

    @classmethod
    def from_json(cls, raw: str | bytes) -> RecoveryPlan:
        """Parse a recovery plan; raise ``ProtocolError`` if it is not one."""
        data = _load(raw, "recovery plan")
        if not isinstance(data, dict):
            raise ProtocolError("a recovery plan must be a JSON object")
        return cls.from_fields(data, "recovery")


# --------------------------------------------------------------------------- RPC


@dataclass(frozen=True, kw_only=True)
class RpcMessage(Message):
    """A message of the registration RPC: its JSON names its type under ``op``."""

    KEY: ClassVar[str] = "op"


@dataclass(frozen=True, kw_only=True)
class Register(RpcMessage):
    """A newcomer asks the leader for a place in the next generation."""

    TYPE: ClassVar[str] = "register"
    worker: str

    def validate(self) -> None:
        if not self.worker:
            raise ProtocolError("register.worker must not be empty")


@dataclass(frozen=True, kw_only=True)
class Refused(RpcMessage):
    """The leader will not admit a newcomer."""

    TYPE: ClassVar[str] = "refused"
    reason: str = ""


def rpc_from_json(raw: str | bytes) -> Register:
    """Parse a request from the RPC list."""
    msg: Register = parse(_load(raw, "RPC request"), {"register": Register}, "RPC request", "op")
    return msg


def reply_from_json(raw: str | bytes) -> PreparePlan | Refused:
    """Parse the leader's answer to a registration: the plan to join, or a refusal."""
    data = _load(raw, "registration reply")
    if isinstance(data, dict) and "op" in data:
        refused: Refused = parse(data, {"refused": Refused}, "registration reply", "op")
        return refused
    plan = plan_from_dict(data)
    if not isinstance(plan, PreparePlan) or isinstance(plan, SwitchPlan):
        raise ProtocolError(f"a registration reply must be a prepare plan, not {plan.TYPE}")
    return plan


# --------------------------------------------------------------------------- control requests


@dataclass(frozen=True, kw_only=True)
class StopRequest(RuntimeMessage):
    """Stop the job at an agreed mini-batch."""

    TYPE: ClassVar[str] = "stop"
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ScaleInRequest(RuntimeMessage):
    """Let ``workers`` leave at an agreed mini-batch."""

    TYPE: ClassVar[str] = "scale_in"
    workers: tuple[str, ...]
    reason: str = "scale_in"


@dataclass(frozen=True, kw_only=True)
class MigrateRequest(RuntimeMessage):
    """Replace ``workers`` by ``joiners`` newcomers in one switch."""

    TYPE: ClassVar[str] = "migrate"
    workers: tuple[str, ...]
    joiners: int = 0
    reason: str = "migrate"

    def validate(self) -> None:
        at_least(self.joiners, 0, "migrate.joiners")


@dataclass(frozen=True, kw_only=True)
class JoinersRequest(RuntimeMessage):
    """Newcomers announced together (they share one switch anyway)."""

    TYPE: ClassVar[str] = "joiners"
    workers: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ProfileRequest(RuntimeMessage):
    """Measure samples/s from ``max`` workers down to ``min``."""

    TYPE: ClassVar[str] = "profile"
    min: int
    max: int
    batches: int

    def validate(self) -> None:
        at_least(self.min, 1, "profile.min")
        if self.max < self.min:
            raise ProtocolError("profile.max must be at least profile.min")
        at_least(self.batches, 2, "profile.batches")


@dataclass(frozen=True, kw_only=True)
class RankOrderRequest(RuntimeMessage):
    """The job's workers in the allocation's rank order: the next generations follow it."""

    TYPE: ClassVar[str] = "rank_order"
    workers: tuple[str, ...]

    def validate(self) -> None:
        if not self.workers:
            raise ProtocolError("rank_order.workers must not be empty")
        _check_members(self.workers, "rank_order.workers")


ControlRequest = (
    StopRequest
    | ScaleInRequest
    | MigrateRequest
    | JoinersRequest
    | ProfileRequest
    | RankOrderRequest
)
_REQUESTS: dict[str, type[ControlRequest]] = {
    c.TYPE: c
    for c in (
        StopRequest,
        ScaleInRequest,
        MigrateRequest,
        JoinersRequest,
        ProfileRequest,
        RankOrderRequest,
    )
}


def request_from_dict(data: Any) -> ControlRequest:
    """Parse a control request (``{"kind": ..., **payload}``)."""
    request: ControlRequest = parse(data, _REQUESTS, "control request", key="kind")
    return request


def request_from_entry(fields: dict[str, str]) -> ControlRequest:
    """Parse one entry of the control stream (``kind`` and a JSON ``payload``)."""
    payload = _load(fields.get("payload", "{}"), "control request payload")
    if not isinstance(payload, dict):
        raise ProtocolError("a control request payload must be a JSON object")
    return request_from_dict({**payload, "kind": fields.get("kind")})


@dataclass(frozen=True, kw_only=True)
class ProfileState(Record):
    """A profile in progress: its bounds and where the current level's measurement starts."""

    min: int
    max: int
    batches: int
    start: int | None = None


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, kw_only=True)
class RuntimeEvent(RuntimeMessage):
    """An entry of the job's event stream (read by the agents: ``report_from_event``)."""


@dataclass(frozen=True, kw_only=True)
class ProgressEvent(RuntimeEvent):
    """Progress of the job (at most every 0.5 s): step, samples/s, mean loss."""

    TYPE: ClassVar[str] = "progress"
    step: int
    samples_per_s: float
    loss: float | None
    world: int
    generation: int


@dataclass(frozen=True, kw_only=True)
class ScaleDoneEvent(RuntimeEvent):
    """A switch happened: the new membership, who joined and left, the pause."""

    TYPE: ClassVar[str] = "scale_done"
    generation: int
    world: int
    members: tuple[str, ...]
    joiners: tuple[str, ...]
    leavers: tuple[str, ...]
    pause_s: float
    step: int
    new_leader: str | None = None


@dataclass(frozen=True, kw_only=True)
class StragglerEvent(RuntimeEvent):
    """A worker was slower than 1.2x the median for 10 mini-batches in a row."""

    TYPE: ClassVar[str] = "straggler"
    worker: str
    ratio: float
    step: int


@dataclass(frozen=True, kw_only=True)
class WorkerFailedEvent(RuntimeEvent):
    """A member of a failed generation neither survived nor kept its liveness key."""

    TYPE: ClassVar[str] = "worker_failed"
    worker: str
    generation: int


@dataclass(frozen=True, kw_only=True)
class RecoveredEvent(RuntimeEvent):
    """The survivors of a failed generation train again."""

    TYPE: ClassVar[str] = "recovered"
    mode: RecoveryMode
    generation: int
    world: int
    dead: tuple[str, ...]
    step: int
    restored_step: int | None


@dataclass(frozen=True, kw_only=True)
class ProfileDoneEvent(RuntimeEvent):
    """The throughput curve of a profile (worker count as text -> samples/s)."""

    TYPE: ClassVar[str] = "profile_done"
    curve: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FinishedEvent(RuntimeEvent):
    """Training ended (``finished``) or stopped on request (``stopped``)."""

    TYPE: ClassVar[str] = "finished"
    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class FailedEvent(RuntimeEvent):
    """A worker cannot continue (it exits non-zero)."""

    TYPE: ClassVar[str] = "failed"
    worker: str
    error: str


@dataclass(frozen=True, kw_only=True)
class CheckpointSavedEvent(RuntimeEvent):
    """Rank 0 stored a checkpoint (``final``: the one written when training finished).

    ``path`` and ``pruned`` are relative to the job's store prefix; ``pruned``
    names the checkpoints the keep rule deleted right after this one was saved.
    """

    TYPE: ClassVar[str] = "checkpoint_saved"
    step: int
    path: str
    size: int
    sha256: str
    final: bool = False
    pruned: tuple[str, ...] = ()

    def validate(self) -> None:
        at_least(self.step, 0, "checkpoint_saved.step")
        check_job_path(self.path, "checkpoints", "checkpoint_saved.path")
        check_stored(self.size, self.sha256, "checkpoint_saved")
        for i, path in enumerate(self.pruned):
            check_job_path(path, "checkpoints", f"checkpoint_saved.pruned[{i}]")


@dataclass(frozen=True, kw_only=True)
class CheckpointSkippedEvent(RuntimeEvent):
    """A checkpoint failed its check on load (size, sha256, unreadable) and an older one was used."""

    TYPE: ClassVar[str] = "checkpoint_skipped"
    step: int
    reason: str

    def validate(self) -> None:
        at_least(self.step, 0, "checkpoint_skipped.step")


@dataclass(frozen=True, kw_only=True)
class ArtifactSavedEvent(RuntimeEvent):
    """The program stored a file of its own (``ctx.save_artifact``) under ``artifacts/``."""

    TYPE: ClassVar[str] = "artifact_saved"
    name: str
    path: str
    size: int
    sha256: str
    step: int | None = None

    def validate(self) -> None:
        check_job_path(self.path, "artifacts", "artifact_saved.path")
        if self.path != f"artifacts/{self.name}":
            raise ProtocolError("artifact_saved.path must be artifacts/<name>")
        check_stored(self.size, self.sha256, "artifact_saved")
        at_least(self.step, 0, "artifact_saved.step")


@dataclass(frozen=True, kw_only=True)
class MetricPoint(Record):
    """The values a program logged at one step (``ctx.log_metrics``)."""

    step: int
    values: dict[str, float]

    def validate(self) -> None:
        at_least(self.step, 0, "metric.step")
        try:
            object.__setattr__(self, "values", check_metric_values(self.values, "metric.values"))
        except OutputError as exc:
            raise ProtocolError(str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class MetricsEvent(RuntimeEvent):
    """Metric points a program logged since the last such event (at most one a second)."""

    TYPE: ClassVar[str] = "metrics"
    points: tuple[MetricPoint, ...]

    def validate(self) -> None:
        if not 1 <= len(self.points) <= MAX_POINTS_PER_EVENT:
            raise ProtocolError(f"metrics.points must hold 1 to {MAX_POINTS_PER_EVENT} points")


def check_job_path(path: str, folder: str, where: str) -> None:
    """Refuse a job-relative path that is not inside ``folder`` of the job's prefix."""
    try:
        check_output_path(path, where, folder)
    except OutputError as exc:
        raise ProtocolError(str(exc)) from None


def check_stored(size: int, sha256: str, where: str) -> None:
    """Refuse a negative size or a sha256 that is not 64 lowercase hex digits."""
    at_least(size, 0, f"{where}.size")
    try:
        check_sha256(sha256, f"{where}.sha256")
    except OutputError as exc:
        raise ProtocolError(str(exc)) from None


def finite_or_none(value: float) -> float | None:
    """A float for a JSON message: NaN and infinities become null."""
    return value if math.isfinite(value) else None


def publish(client: redis.Redis, keys: JobKeys, event: RuntimeEvent) -> None:
    """Append one typed event to the job's event stream."""
    data = event.to_dict()
    del data[event.KEY]
    emit_event(client, keys, event.TYPE, **data)
