"""The messages of the elastic runtime: plans, requests and RPC, as frozen records.

Its events are declared with the agent's reading of them in ``workers.runtime_events``.

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
    leader, workers ──(events stream: workers.runtime_events)──▶ agents
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from workers.runtime_events import RecoveryMode
from workers.schema import Message, ProtocolError, Record, at_least, parse


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
