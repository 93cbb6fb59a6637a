"""The elastic runtime's events, each declared once: written, read and reported from here.

An elastic job's runtime appends its events to the job's stream; every agent
that hosts a worker of the job reads them and forwards each, once, to the
portal as a report::

    runtime ──publish(XxxEvent(...))──▶ edl:<job>:events ──XREAD──▶ agent ──report──▶ portal
             event.entry():                                  workers.job_events (the gate)
             {"kind": TYPE, "data": JSON}                    Xxx.report_fields(body)
                                                             workers.protocol.EVENT_REPORTS

One frozen dataclass per kind says all of it:

* its fields, in order, are the JSON ``data`` the runtime writes (the wire
  format: ``entry``), and ``validate`` holds the bounds the runtime keeps;
* each field's ``wire(...)`` says how the agent reads it from the stream,
  which the tenant's program may write anything to (``workers.job_events``
  judges an entry's size, encoding and shape first): what the runtime always
  writes may be missing or mistyped there, so most fields are read leniently,
  and the report's own checks (``workers.protocol``) have the last word;
* ``REPORT`` names the report it becomes, and ``report_as`` the report field
  a field becomes where the names differ (``members`` → ``workers``).

A new kind: a ``@declare``\\ d class here whose ``REPORT`` is a report type of
``workers.protocol`` (a new one there if no existing report fits), published
by the runtime with ``workers.elastic.control.publish``; then a golden entry
and report in ``workers/tests/test_runtime_event_wire.py``.

Pure Python: no Redis, Django, Celery or torch (the runtime, the agent and the
portal's protocol all import it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

from workers.outputs import (
    MAX_METRIC_POINTS,
    OutputError,
    check_metric_values,
    check_sha256,
)
from workers.outputs import check_job_path as check_output_path
from workers.schema import Message, ProtocolError, Record, at_least

RecoveryMode = Literal["consistent", "approximate"]
"""How survivors of a failure go on (the runtime's ``recovered`` event, the agent's commands)."""

ENTRY_FIELDS = frozenset({"kind", "data"})
"""The fields of one entry of a job's event stream: the event's kind and its JSON data."""

MAX_POINTS_PER_EVENT = MAX_METRIC_POINTS
"""The most metric points one ``metrics`` event carries (and one ``metrics`` report)."""

SKIPPED_REASON_CHARS = 500
"""The most characters of a ``checkpoint_skipped`` reason that reach the portal."""

ARTIFACT_NAME_CHARS = 255
"""The most characters of a stored object's name that reach the portal."""

Body = Mapping[str, Any]
"""An event's data as the agent decoded it from the stream (``workers.job_events``)."""

Reader = Callable[[Body, str], Any]
"""How the agent reads one field (by name) of an untrusted event into a report field."""


# --------------------------------------------------------------------------- readers


def given(body: Body, name: str) -> Any:
    """The value as written (a missing field refuses the event); the report checks its type."""
    return body[name]


def given_text(body: Body, name: str) -> str:
    """The value as written, as text (a missing field refuses the event)."""
    return str(body[name])


def optional_int(body: Body, name: str) -> int | None:
    """The value if it is an integer, else None: the report says "not known"."""
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def optional_number(body: Body, name: str) -> float | None:
    """The value if it is a finite number, else None (NaN, from a writer's loss, included)."""
    value = body.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def optional_text(body: Body, name: str) -> str | None:
    """None if missing or null, else the value as text."""
    value = body.get(name)
    return None if value is None else str(value)


def worker_names(body: Body, name: str) -> tuple[str, ...]:
    """A list of worker ids as text (missing or null: none); anything but a list refuses."""
    raw = body.get(name)
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ProtocolError("a list of worker ids was expected")
    return tuple(str(item) for item in raw)


def text_or(default: str, limit: int | None = None) -> Reader:
    """A reader of text that may be missing (then ``default``), cut to ``limit`` characters."""

    def read(body: Body, name: str) -> str:
        text = str(body.get(name, default))
        return text if limit is None else text[:limit]

    return read


# --------------------------------------------------------------------------- declaration


@dataclass(frozen=True)
class Wire:
    """How the agent reads one declared field, and the report field it becomes (None: none)."""

    read: Reader
    report_as: str | None


_WIRE = "wire"


def wire(
    read: Reader = given,
    *,
    report_as: str | None = "",
    default: Any = MISSING,
    default_factory: Any = MISSING,
) -> Any:
    """Declare one field of an event: how the agent reads it and what it reports it as.

    ``report_as``: the report field's name ("": the same; None: not reported).
    ``default``/``default_factory``: as ``dataclasses.field`` (the runtime may leave it out
    when it builds the event; the field is on the wire all the same).
    """
    metadata = {_WIRE: Wire(read=read, report_as=report_as)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def wire_of(declared: Field[Any]) -> Wire:
    """The ``wire`` declaration of one field of an event class."""
    found = declared.metadata.get(_WIRE)
    if not isinstance(found, Wire):
        raise TypeError(f"event field {declared.name} is not declared with wire()")
    return found


@dataclass(frozen=True, kw_only=True)
class RuntimeEvent(Message):
    """An entry of a job's event stream: its ``TYPE`` under ``kind``, its fields as JSON ``data``."""

    KEY: ClassVar[str] = "kind"
    REPORT: ClassVar[str] = ""
    """The ``type`` of the report the agent makes of it (``workers.protocol``)."""
    DERIVED: ClassVar[frozenset[str]] = frozenset()
    """The names of the report fields ``derived`` makes."""

    def entry(self) -> dict[str, str]:
        """The stream entry that carries this event: the wire format, the one place it is made."""
        data = self.to_dict()
        del data[self.KEY]
        return {"kind": self.TYPE, "data": json.dumps(data)}

    @classmethod
    def report_fields(cls, body: Body) -> dict[str, Any]:
        """The report's fields for an event of this kind read from the stream (``body``).

        Read field by field as declared (``wire``), then ``derived``; a missing
        field the report needs raises ``KeyError``, a malformed one ``ProtocolError``.
        """
        out: dict[str, Any] = {}
        for declared in fields(cls):
            spec = wire_of(declared)
            if spec.report_as is not None:  # a field the report leaves out is not read
                out[spec.report_as or declared.name] = spec.read(body, declared.name)
        out.update(cls.derived(body))
        return out

    @classmethod
    def derived(cls, body: Body) -> dict[str, Any]:
        """Report fields that are no one declared field: a constant, one made of several
        fields, one the runtime does not write (none unless a class says so in ``DERIVED``)."""
        return {}

    @classmethod
    def report_names(cls) -> frozenset[str]:
        """The report fields this kind's ``report_fields`` makes (``derived`` included)."""
        names = {
            spec.report_as or declared.name
            for declared in fields(cls)
            if (spec := wire_of(declared)).report_as is not None
        }
        return frozenset(names | cls.DERIVED)


_EVENTS: dict[str, type[RuntimeEvent]] = {}

E = TypeVar("E", bound=type[RuntimeEvent])


def declare(cls: E) -> E:
    """Register an event class: its kind may be declared once, and every field with ``wire``."""
    if not cls.TYPE or not cls.REPORT:
        raise TypeError(f"{cls.__name__} needs a TYPE and a REPORT")
    if cls.TYPE in _EVENTS:
        raise TypeError(f"runtime event {cls.TYPE!r} is declared twice")
    for declared in fields(cls):
        wire_of(declared)
    _EVENTS[cls.TYPE] = cls
    return cls


def event_types() -> dict[str, type[RuntimeEvent]]:
    """Every declared event class by its kind."""
    return dict(_EVENTS)


# --------------------------------------------------------------------------- shared records


@dataclass(frozen=True, kw_only=True)
class MetricPoint(Record):
    """The values a program logged at one step (``edl.Context.log_metrics``).

    The same record in the runtime's ``metrics`` event and the agent's ``metrics`` report.
    """

    step: int
    values: dict[str, float]

    def validate(self) -> None:
        at_least(self.step, 0, "step")
        try:
            object.__setattr__(self, "values", check_metric_values(self.values))
        except OutputError as exc:
            raise ProtocolError(str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class CurvePoint(Record):
    """Throughput of the job at one parallelism (a point of a ``profile_done`` report)."""

    workers: int
    samples_per_s: float


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
    """A float for an event: NaN and infinities become null."""
    return value if math.isfinite(value) else None


def read_curve(body: Body, name: str) -> tuple[CurvePoint, ...]:
    """A throughput curve given as {workers: samples/s} or as a list of pairs/objects."""
    raw = body[name]
    points: list[CurvePoint] = []
    if isinstance(raw, dict):
        for workers, value in raw.items():
            points.append(CurvePoint(workers=int(workers), samples_per_s=value))
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict):
                points.append(
                    CurvePoint(workers=item["workers"], samples_per_s=item["samples_per_s"])
                )
            else:
                workers, value = item
                points.append(CurvePoint(workers=workers, samples_per_s=value))
    else:
        raise ProtocolError("profile_done.curve must be an object or a list")
    return tuple(sorted(points, key=lambda p: p.workers))


def read_metric_points(body: Body, name: str) -> tuple[MetricPoint, ...]:
    """The points of a metrics event, evenly thinned to ``MAX_METRIC_POINTS`` if there are more."""
    raw = body[name]
    if not isinstance(raw, list | tuple):
        raise ProtocolError("metrics.points must be a list")
    stride = max(1, math.ceil(len(raw) / MAX_METRIC_POINTS))
    points = []
    for item in raw[::stride]:
        if not isinstance(item, dict):
            raise ProtocolError("metrics.points must hold objects")
        points.append(MetricPoint(step=item["step"], values=item["values"]))
    return tuple(points)


def read_artifact_name(body: Body, name: str) -> str:
    """The object's name, or its path where the name is missing or empty."""
    return str(body.get(name) or body["path"])[:ARTIFACT_NAME_CHARS]


def read_checkpoint_kind(body: Body, name: str) -> str:
    """``final`` for the checkpoint written when training finished, else ``checkpoint``."""
    return "final" if body.get(name) is True else "checkpoint"


# --------------------------------------------------------------------------- the events


@declare
@dataclass(frozen=True, kw_only=True)
class ProgressEvent(RuntimeEvent):
    """Progress of the job (at most every 0.5 s): step, samples/s, mean loss."""

    TYPE: ClassVar[str] = "progress"
    REPORT: ClassVar[str] = "progress"
    step: int = wire()
    samples_per_s: float = wire()
    loss: float | None = wire(optional_number)
    world: int = wire()
    generation: int = wire(optional_int)


@declare
@dataclass(frozen=True, kw_only=True)
class ScaleDoneEvent(RuntimeEvent):
    """A switch happened: the new membership, who joined and left, the pause."""

    TYPE: ClassVar[str] = "scale_done"
    REPORT: ClassVar[str] = "scale_done"
    generation: int = wire(optional_int)
    world: int = wire(optional_int)
    members: tuple[str, ...] = wire(worker_names, report_as="workers")
    joiners: tuple[str, ...] = wire(worker_names)
    leavers: tuple[str, ...] = wire(worker_names)
    pause_s: float = wire(optional_number)
    step: int = wire(optional_int)
    new_leader: str | None = wire(optional_text, default=None)


@declare
@dataclass(frozen=True, kw_only=True)
class StragglerEvent(RuntimeEvent):
    """A worker was slower than 1.2x the median for 10 mini-batches in a row."""

    TYPE: ClassVar[str] = "straggler"
    REPORT: ClassVar[str] = "straggler"
    worker: str = wire(given_text, report_as="worker_id")
    ratio: float = wire()
    step: int = wire(report_as=None)


@declare
@dataclass(frozen=True, kw_only=True)
class WorkerFailedEvent(RuntimeEvent):
    """A member of a failed generation neither survived nor kept its liveness key.

    The report's ``error`` is read from the stream too, though the runtime does
    not write one (``DERIVED``).
    """

    TYPE: ClassVar[str] = "worker_failed"
    REPORT: ClassVar[str] = "worker_failed"
    DERIVED: ClassVar[frozenset[str]] = frozenset({"error"})
    worker: str = wire(given_text, report_as="worker_id")
    generation: int = wire(optional_int)

    @classmethod
    def derived(cls, body: Body) -> dict[str, Any]:
        return {"error": text_or("")(body, "error")}


@declare
@dataclass(frozen=True, kw_only=True)
class RecoveredEvent(RuntimeEvent):
    """The survivors of a failed generation train again."""

    TYPE: ClassVar[str] = "recovered"
    REPORT: ClassVar[str] = "recovered"
    mode: RecoveryMode = wire(text_or(""))  # noqa: RUF009 (wire makes a dataclasses.field)
    generation: int = wire(optional_int)
    world: int = wire(optional_int)
    dead: tuple[str, ...] = wire(worker_names)
    step: int = wire(optional_int)
    restored_step: int | None = wire(optional_int)


@declare
@dataclass(frozen=True, kw_only=True)
class ProfileDoneEvent(RuntimeEvent):
    """The throughput curve of a profile (worker count as text -> samples/s)."""

    TYPE: ClassVar[str] = "profile_done"
    REPORT: ClassVar[str] = "profile_done"
    curve: dict[str, float] = wire(read_curve, default_factory=dict)  # noqa: RUF009 (as above)


@declare
@dataclass(frozen=True, kw_only=True)
class FinishedEvent(RuntimeEvent):
    """Training ended (``finished``) or stopped on request (``stopped``)."""

    TYPE: ClassVar[str] = "finished"
    REPORT: ClassVar[str] = "finished"
    step: int = wire(optional_int)
    reason: str = wire(text_or("finished"))


@declare
@dataclass(frozen=True, kw_only=True)
class FailedEvent(RuntimeEvent):
    """A worker cannot continue (it exits non-zero)."""

    TYPE: ClassVar[str] = "failed"
    REPORT: ClassVar[str] = "failed"
    worker: str = wire(report_as=None)
    error: str = wire(text_or(""))


@declare
@dataclass(frozen=True, kw_only=True)
class CheckpointSavedEvent(RuntimeEvent):
    """Rank 0 stored a checkpoint (``final``: the one written when training finished).

    ``path`` and ``pruned`` are relative to the job's store prefix; ``pruned``
    names the checkpoints the keep rule deleted right after this one was saved.
    The report (``artifact_stored``) is named after the path's last part.
    """

    TYPE: ClassVar[str] = "checkpoint_saved"
    REPORT: ClassVar[str] = "artifact_stored"
    DERIVED: ClassVar[frozenset[str]] = frozenset({"name"})
    step: int = wire(optional_int)
    path: str = wire()
    size: int = wire()
    sha256: str = wire()
    final: bool = wire(read_checkpoint_kind, report_as="kind", default=False)
    pruned: tuple[str, ...] = wire(worker_names, default=())

    def validate(self) -> None:
        at_least(self.step, 0, "checkpoint_saved.step")
        check_job_path(self.path, "checkpoints", "checkpoint_saved.path")
        check_stored(self.size, self.sha256, "checkpoint_saved")
        for i, path in enumerate(self.pruned):
            check_job_path(path, "checkpoints", f"checkpoint_saved.pruned[{i}]")

    @classmethod
    def derived(cls, body: Body) -> dict[str, Any]:
        return {"name": str(body["path"]).rsplit("/", 1)[-1]}


@declare
@dataclass(frozen=True, kw_only=True)
class CheckpointSkippedEvent(RuntimeEvent):
    """A checkpoint failed its check on load (size, sha256, unreadable) and an older one was used."""

    TYPE: ClassVar[str] = "checkpoint_skipped"
    REPORT: ClassVar[str] = "checkpoint_skipped"
    step: int = wire()
    reason: str = wire(text_or("", limit=SKIPPED_REASON_CHARS))

    def validate(self) -> None:
        at_least(self.step, 0, "checkpoint_skipped.step")


@declare
@dataclass(frozen=True, kw_only=True)
class ArtifactSavedEvent(RuntimeEvent):
    """The program stored a file of its own (``ctx.save_artifact``) under ``artifacts/``."""

    TYPE: ClassVar[str] = "artifact_saved"
    REPORT: ClassVar[str] = "artifact_stored"
    DERIVED: ClassVar[frozenset[str]] = frozenset({"kind"})
    name: str = wire(read_artifact_name)
    path: str = wire()
    size: int = wire()
    sha256: str = wire()
    step: int | None = wire(optional_int, default=None)

    def validate(self) -> None:
        check_job_path(self.path, "artifacts", "artifact_saved.path")
        if self.path != f"artifacts/{self.name}":
            raise ProtocolError("artifact_saved.path must be artifacts/<name>")
        check_stored(self.size, self.sha256, "artifact_saved")
        at_least(self.step, 0, "artifact_saved.step")

    @classmethod
    def derived(cls, body: Body) -> dict[str, Any]:
        return {"kind": "user"}


@declare
@dataclass(frozen=True, kw_only=True)
class MetricsEvent(RuntimeEvent):
    """Metric points a program logged since the last such event (at most one a second)."""

    TYPE: ClassVar[str] = "metrics"
    REPORT: ClassVar[str] = "metrics"
    points: tuple[MetricPoint, ...] = wire(read_metric_points)

    def validate(self) -> None:
        if not 1 <= len(self.points) <= MAX_POINTS_PER_EVENT:
            raise ProtocolError(f"metrics.points must hold 1 to {MAX_POINTS_PER_EVENT} points")


EVENT_KINDS: tuple[str, ...] = tuple(_EVENTS)
"""Every kind the runtime writes: the agent refuses an entry of any other."""
