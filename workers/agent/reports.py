"""Reports out of the agent: the one function that sends them, and the
translation of a job's runtime events into reports."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from workers.agent.celery_app import agent_app
from workers.outputs import MAX_METRIC_POINTS
from workers.protocol import (
    REPORT_TASK,
    REPORTS_QUEUE,
    ArtifactStored,
    CheckpointSkipped,
    CurvePoint,
    Failed,
    Finished,
    Heartbeat,
    MetricPoint,
    Metrics,
    ProfileDone,
    Progress,
    ProtocolError,
    Recovered,
    Report,
    ScaleDone,
    Straggler,
    WorkerFailed,
)
from workers.signing import seal

log = logging.getLogger(__name__)


def send_report(
    report: Report,
    *,
    key: bytes,
    queue: str = REPORTS_QUEUE,
    expires: float | None = None,
    app: Celery | None = None,
    now: Callable[[], float] = time.time,
) -> bool:
    """Send one report to the control plane as the Celery task ``REPORT_TASK``.

    The only place where reports leave the agent (through ``app``, by default
    the agent's own), each in an envelope signed with the node's ``key``
    (``workers.signing``).  Returns False (and logs) when the broker refuses
    it or it cannot be signed: a lost report must not take the agent down.
    """
    sender = app if app is not None else agent_app()
    try:
        # Sealing refuses what JSON cannot carry (text that does not encode, NaN): a
        # report made of a job's data must not raise through the agent's loop.
        envelope = seal(report.to_dict(), node=report.node, key=key, now=now())
    except ValueError:
        log.exception("could not sign %s report", report.TYPE)
        return False
    try:
        sender.send_task(
            REPORT_TASK, args=[envelope], queue=queue, expires=expires, ignore_result=True
        )
    except Exception:  # the broker's errors are many and transport-specific
        log.exception("could not send %s report", report.TYPE)
        return False
    return True


def send_heartbeat(
    report: Heartbeat,
    *,
    key: bytes,
    queue: str,
    expires_seconds: float,
    app: Celery | None = None,
) -> bool:
    """A heartbeat expires: a stale one says nothing once a newer one exists."""
    return send_report(report, key=key, queue=queue, expires=expires_seconds, app=app)


def _optional_number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _optional_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _names(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ProtocolError("a list of worker ids was expected")
    return tuple(str(item) for item in raw)


def _curve(raw: Any) -> tuple[CurvePoint, ...]:
    """A throughput curve given as {workers: samples/s} or as a list of pairs/objects."""
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


def _stored(common: dict[str, Any], kind: str, event: dict[str, Any]) -> ArtifactStored:
    """A checkpoint or an artifact the runtime wrote to the store."""
    path = event["path"]
    if kind == "checkpoint_saved":
        return ArtifactStored(
            **common,
            kind="final" if event.get("final") is True else "checkpoint",
            path=path,
            size=event["size"],
            sha256=event["sha256"],
            step=_optional_int(event.get("step")),
            name=str(path).rsplit("/", 1)[-1],
            pruned=_names(event.get("pruned")),
        )
    return ArtifactStored(
        **common,
        kind="user",
        path=path,
        size=event["size"],
        sha256=event["sha256"],
        step=_optional_int(event.get("step")),
        name=str(event.get("name") or path)[:255],
    )


def _metric_points(raw: Any) -> tuple[MetricPoint, ...]:
    """The points of a metrics event, evenly thinned to ``MAX_METRIC_POINTS`` if there are more."""
    if not isinstance(raw, list | tuple):
        raise ProtocolError("metrics.points must be a list")
    stride = max(1, math.ceil(len(raw) / MAX_METRIC_POINTS))
    points = []
    for item in raw[::stride]:
        if not isinstance(item, dict):
            raise ProtocolError("metrics.points must hold objects")
        points.append(MetricPoint(step=item["step"], values=item["values"]))
    return tuple(points)


def report_from_event(node: str, job: str, event_id: str, event: dict[str, Any]) -> Report | None:
    """The report for one runtime event, or None for a kind the control plane does not need.

    Raises ``ProtocolError`` for an event whose fields do not make a valid report.
    """
    kind = event.get("kind")
    common: dict[str, Any] = {"node": node, "job": job, "event_id": event_id}
    try:
        if kind == "progress":
            return Progress(
                **common,
                step=event["step"],
                samples_per_s=event["samples_per_s"],
                loss=_optional_number(event.get("loss")),
                world=event["world"],
                generation=_optional_int(event.get("generation")),
            )
        if kind == "scale_done":
            new_leader = event.get("new_leader")
            return ScaleDone(
                **common,
                world=_optional_int(event.get("world")),
                step=_optional_int(event.get("step")),
                generation=_optional_int(event.get("generation")),
                workers=_names(event.get("members")),
                joiners=_names(event.get("joiners")),
                leavers=_names(event.get("leavers")),
                pause_s=_optional_number(event.get("pause_s")),
                new_leader=None if new_leader is None else str(new_leader),
            )
        if kind == "straggler":
            return Straggler(**common, worker_id=str(event["worker"]), ratio=event["ratio"])
        if kind == "worker_failed":
            return WorkerFailed(
                **common,
                worker_id=str(event["worker"]),
                error=str(event.get("error", "")),
                generation=_optional_int(event.get("generation")),
            )
        if kind == "recovered":
            return Recovered(
                **common,
                mode=str(event.get("mode", "")),
                world=_optional_int(event.get("world")),
                step=_optional_int(event.get("step")),
                generation=_optional_int(event.get("generation")),
                dead=_names(event.get("dead")),
                restored_step=_optional_int(event.get("restored_step")),
            )
        if kind == "profile_done":
            return ProfileDone(**common, curve=_curve(event["curve"]))
        if kind == "finished":
            return Finished(
                **common,
                step=_optional_int(event.get("step")),
                reason=str(event.get("reason", "finished")),
            )
        if kind == "failed":
            return Failed(**common, error=str(event.get("error", "")))
        if kind in ("checkpoint_saved", "artifact_saved"):
            return _stored(common, kind, event)
        if kind == "checkpoint_skipped":
            return CheckpointSkipped(
                **common, step=event["step"], reason=str(event.get("reason", ""))[:500]
            )
        if kind == "metrics":
            return Metrics(**common, points=_metric_points(event["points"]))
    except KeyError as exc:
        raise ProtocolError(f"runtime event {kind} lacks field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"runtime event {kind} is malformed: {exc}") from None
    return None
