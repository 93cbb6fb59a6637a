"""What the control plane does with each agent report (the ``control.agent_report`` task).

A report arrives in an envelope signed with its node's key
(``workers.signing``); ``handle_signed_report`` refuses, logs and ignores one
that is unsigned, badly signed, stale, from the future, or whose body names
another node than the one that signed it, and a job report from a node that
does not host the job (``jobs.agent_trust.hosts``).  A heartbeat's worker
list keeps only the jobs its node hosts.  Every report is then parsed
strictly (``workers.protocol``); a malformed one is logged and changes
nothing.  Handlers are idempotent: runtime events carry a stream id and a job
applies each id once (ids only grow); the other reports describe a state, and
applying a state twice is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from control import membership_claims, outputs, program_exits
from control.dropped_events import events_dropped
from control.endings import accrue_service, complete_job, fail_or_retry
from control.logs import log_lines
from control.rejections import on_rejected
from control.report_time import report_time as _at
from control.stragglers import shrink_around_straggler
from inventory.registration import do_heartbeat
from jobs import agent_trust, holdings
from jobs.agent_commands import job_id_from_name, worker_id
from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, EventKind, JobState
from jobs.environment_caches import do_record_cache_report, do_record_eviction_result
from jobs.lifecycle import broadcast, record, record_metric, request_tick, save_fields, transition
from jobs.models import Job
from jobs.services import do_set_parallelism
from jobs.sessions import note_activity
from scheduler.curves import record_measurement
from workers.protocol import (
    ArtifactStored,
    CheckpointSkipped,
    EnvironmentCacheReport,
    EnvironmentEvicted,
    EventsDropped,
    Failed,
    Finished,
    Heartbeat,
    JobEventReport,
    JobReport,
    LabActivity,
    LogLines,
    Metrics,
    ProfileDone,
    Progress,
    ProtocolError,
    Recovered,
    Rejected,
    Report,
    ScaleDone,
    Started,
    Straggler,
    WorkerExited,
    WorkerFailed,
)
from workers.signing import SignatureError

log = logging.getLogger(__name__)
LOG_TAIL_CHARS = 4000
RECENT_EVENTS = 64  # runtime event ids remembered per job, to apply late ones once
OUTPUT_REPORTS = (ArtifactStored, CheckpointSkipped, Metrics)
"""Reports of what a job produced: none moves its membership, so none overtakes a recovery."""
OUTPUT_MARK = " output"
"""Appended to an output report's id in ``recent_event_ids`` (``_remembered``)."""


def _event_key(event_id: str) -> tuple[int, ...]:
    """Redis stream ids (``ms-seq``) in numeric order; anything else sorts first."""
    try:
        return tuple(int(part) for part in event_id.split("-"))
    except ValueError:
        return ()


def handle_signed_report(envelope: Any) -> str:
    """Check one report's envelope and apply it as its node's word; ``refused: ...`` if forged."""
    try:
        signed = agent_trust.open_report(envelope)
    except SignatureError as exc:
        log.warning("refused an agent report: %s", exc)
        return f"refused: {exc}"
    if agent_trust.was_applied(signed):  # redelivered after a worker died before its ack
        return "duplicate: applied already"
    outcome = handle_report(signed.body, signed_by=signed.node)
    agent_trust.mark_applied(signed)
    return outcome


def handle_report(payload: Any, *, signed_by: str | None = None) -> str:
    """Apply one report; return a short outcome (for logs and tests).

    ``signed_by`` is the node whose key signed it: the report must be that
    node's, and may only speak of jobs it hosts.  Without it (in-process
    callers and tests that hand over a report directly) the report is taken
    as the node's own word.
    """
    try:
        report = Report.from_dict(payload)
    except ProtocolError as exc:
        log.warning("rejected agent report: %s", exc)
        return f"invalid: {exc}"
    if signed_by is not None and report.node != signed_by:
        log.warning(
            "refused a %s report: names node %s, signed by %s", report.TYPE, report.node, signed_by
        )
        return "refused: wrong node"
    if isinstance(report, Heartbeat):
        info = report.to_dict()
        if signed_by is not None:
            info["workers"] = _hosted_workers(report)
        known = do_heartbeat(node=report.node, info=info)
        return "heartbeat" if known else "unknown node"
    if isinstance(report, Rejected):
        return on_rejected(report, signed_by=signed_by)
    if isinstance(report, EnvironmentCacheReport):
        return do_record_cache_report(report)
    if isinstance(report, EnvironmentEvicted):
        return do_record_eviction_result(report)
    if not isinstance(report, JobReport):
        return "ignored"
    job_id = job_id_from_name(report.job)
    if job_id is None:
        return "unknown job"
    if signed_by is not None and not agent_trust.hosts(report.node, job_id, report.job):
        log.warning(
            "refused a %s report from %s: it does not host %s", report.TYPE, report.node, report.job
        )
        return "refused: not hosted"
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return "unknown job"
        if isinstance(report, JobEventReport):
            late = _event_key(report.event_id) <= _event_key(job.last_event_id)
            seen = {report.event_id, _remembered(report)} & set(job.recent_event_ids)
            if seen or (late and isinstance(report, Progress)):
                return "duplicate"
            # Agents on several nodes forward a job's events: an older one may arrive after a
            # newer one. Progress that old is stale; any other event still counts, once.
            if not isinstance(report, Progress):
                remembered = [*job.recent_event_ids, _remembered(report)]
                job.recent_event_ids = remembered[-RECENT_EVENTS:]
            if not late:
                job.last_event_id = report.event_id
            save_fields(job, "last_event_id", "recent_event_ids")
        handler = _HANDLERS.get(type(report))
        if handler is None:
            return "noted"
        return handler(job, report)


def _hosted_workers(beat: Heartbeat) -> list[dict[str, Any]]:
    """The heartbeat's workers of jobs its node hosts; the others are logged and dropped."""
    verdict: dict[str, bool] = {}
    kept = []
    for worker in beat.workers:
        if worker.job not in verdict:
            job_id = job_id_from_name(worker.job)
            hosted = job_id is not None and agent_trust.hosts(beat.node, job_id, worker.job)
            verdict[worker.job] = hosted
            if not hosted:
                log.warning(
                    "heartbeat of %s lists job %s, which it does not host", beat.node, worker.job
                )
        if verdict[worker.job]:
            kept.append(worker.to_dict())
    return kept


def _progress(job: Job, report: Any) -> str:
    if job.state not in ACTIVE_STATES:
        return "stale"
    now = _at(report)
    accrue_service(job, now)
    job.step = report.step
    job.samples_per_s = report.samples_per_s
    job.loss = report.loss
    job.measured_curve = record_measurement(job.measured_curve, report.world, report.samples_per_s)
    save_fields(
        job,
        "step",
        "samples_per_s",
        "loss",
        "attained_gpu_seconds",
        "last_service_at",
        "measured_curve",
    )
    record_metric(
        job,
        at=now,
        step=report.step,
        parallelism=report.world,
        samples_per_s=report.samples_per_s,
        loss=report.loss,
    )
    broadcast(job, "job.progress")
    return "progress"


def _scale_done(job: Job, report: ScaleDone) -> str:
    now = _at(report)
    accrue_service(job, now)
    kept: set[str] = set()
    if report.workers and job.state in ACTIVE_STATES:
        held = {worker_id(g) for g in holdings.held_gpus(job)}
        leaving = held - set(report.workers)
        kept = leaving - set(membership_claims.believed_leavers(job, leaving, report, now))
        left = holdings.keep_only_workers(job, set(report.workers) | kept)
    else:
        left = ()
    world = report.world or len(report.workers) or job.parallelism
    if kept:  # workers its agents still run stay held, and billed
        world = len(holdings.held_gpus(job))
    pause = f", existing workers paused {report.pause_s:.3f} s" if report.pause_s else ""
    where = f"at step {report.step} (generation {report.generation}){pause}"
    if job.state == JobState.SCALING:
        # The transition saves the whole job, the service just accrued included.
        transition(job, JobState.RUNNING, reason=f"switch done {where}", at=now, parallelism=world)
        broadcast(job, "job.updated")
    elif job.state == JobState.RUNNING and world != job.parallelism:
        # do_set_parallelism reads the job again (and broadcasts): save the service first.
        save_fields(job, "attained_gpu_seconds", "last_service_at")
        why = "profiling" if job.profile_state == "requested" else "runtime"
        do_set_parallelism(
            job_id=job.pk,
            parallelism=world,
            reason=f"{why}: workers {', '.join(left) or '-'} left {where}",
            at=now,
        )
    else:
        return "noted"
    request_tick()
    return "scaled"


def _recovered(job: Job, report: Recovered) -> str:
    """The survivors train again without ``report.dead``: free the dead workers' GPUs.

    The runtime never takes a dropped worker back, and nobody restarts one in
    place, so its GPU would otherwise stay held, with no process, until the job
    ends.  Only a ``running`` job shrinks, and only on a report no newer event
    has overtaken (``_overtaken``): while it is ``scaling`` the holdings
    describe the switch in flight (its joiners may reuse a dead worker's id)
    and the ``scale_done`` that ends it keeps only the members; an overtaken
    report may name a worker the scheduler has since given back to the job.
    The next tick may give the freed GPU to this job again or to another.
    """
    now = _at(report)
    record(
        job,
        EventKind.RECOVERED,
        now,
        reason=f"{report.mode} recovery after losing {', '.join(report.dead)}",
        from_parallelism=job.parallelism,
        to_parallelism=report.world,
        data={"step": report.step, "generation": report.generation},
    )
    if job.state != JobState.RUNNING or _overtaken(job, report) or not report.dead:
        return "recovered"
    believed = membership_claims.believed_leavers(job, report.dead, report, now)
    membership_claims.free_leavers(
        job,
        believed,
        now,
        lambda freed: f"runtime: {', '.join(freed)} dropped by {report.mode} recovery, GPUs freed",
    )
    return "recovered"


def _remembered(report: JobEventReport) -> str:
    """How ``recent_event_ids`` keeps a report's id: an output's marked (``OUTPUT_MARK``)."""
    if isinstance(report, OUTPUT_REPORTS):
        return report.event_id + OUTPUT_MARK
    return report.event_id


def _overtaken(job: Job, report: JobEventReport) -> bool:
    """Whether an event of the job newer than ``report`` that may move its membership came first.

    Progress and outputs (a checkpoint stored, metrics) never change who
    holds what, and the survivors' may well overtake the recovery they follow
    (agents on several nodes forward a job's events; two report workers apply
    them at once): a checkpoint written just after a recovery and applied
    before it kept the dead worker's GPU held until the job ended (the fault
    suite, 2026-12-03).  A ``scale_done`` (or any other event) newer than the
    report does count: the membership may have moved on since.
    """
    mine = _event_key(report.event_id)
    return any(
        _event_key(other) > mine
        for other in job.recent_event_ids
        if not other.endswith(OUTPUT_MARK)
    )


def _worker_failed(job: Job, report: WorkerFailed) -> str:
    """The runtime dropped a worker: a note only; ``recovered`` frees its GPU.

    The survivors are still rebuilding then; freeing the GPU now would let a
    tick send a scale-out into a recovery in flight.
    """
    record(
        job,
        EventKind.NOTE,
        _at(report),
        reason=f"worker {report.worker_id} dropped: {report.error}",
    )
    return "noted"


def _straggler(job: Job, report: Straggler) -> str:
    return shrink_around_straggler(job, report.worker_id, report.ratio, _at(report))


def _profile_done(job: Job, report: ProfileDone) -> str:
    curve = {str(p.workers): p.samples_per_s for p in report.curve}
    job.throughput_curve = curve
    job.profile_state = "done"
    save_fields(job, "throughput_curve", "profile_state")
    record(
        job,
        EventKind.PROFILED,
        _at(report),
        reason="throughput profiled at "
        + ", ".join(f"{n} GPUs: {v:.0f}/s" for n, v in curve.items()),
        data={"curve": curve},
    )
    return "profiled"


#: The largest step a report may set (the column is a 32-bit PositiveIntegerField).
MAX_STEP = 2**31 - 1


def _finished(job: Job, report: Finished) -> str:
    if job.state in TERMINAL_STATES or report.reason != "finished":
        return "noted"
    if job.state not in ACTIVE_STATES:
        return "stale"
    if report.step is not None and 0 <= report.step <= MAX_STEP:
        job.step = max(job.step, report.step)  # progress ends at the final step (saved with it)
    complete_job(job, f"training finished at step {report.step}", _at(report))
    return "completed"


def _failed(job: Job, report: Failed) -> str:
    """The runtime (or the agent) says the job failed: retried while restarts remain,
    unless no retry can help (``final``: its environment does not build)."""
    if job.state in TERMINAL_STATES:
        return "noted"
    return fail_or_retry(job, report.error, _at(report), retry=not report.final)


def _worker_exited(job: Job, report: WorkerExited) -> str:
    if report.log_tail:
        job.log_tail = (job.log_tail + report.log_tail)[-LOG_TAIL_CHARS:]
        save_fields(job, "log_tail")
        broadcast(job, "job.log")
    membership_claims.remember_exit(job, report, _at(report))
    decided = program_exits.on_worker_exited(job, report, _at(report))
    if decided is not None:
        return decided
    freed = membership_claims.on_exit(job, report, _at(report))
    if freed is not None:
        return freed
    if report.outcome == "crashed":
        record(
            job,
            EventKind.NOTE,
            _at(report),
            reason=f"worker {report.worker_id} crashed (exit {report.exit_code})",
        )
    return "noted"


def _started(job: Job, report: Started) -> str:
    used = report.environment
    if used is not None:  # what its processes run in: built now, or the cache's
        data = {"environment": used.key, "hit": used.hit, "build_s": used.build_s,
                "packages": list(used.packages), "node": report.node}  # fmt: skip
        record(job, EventKind.NOTE, _at(report), reason=f"{report.node}: {used.describe()}",
               data=data)  # fmt: skip
        job.environment_used = data
        save_fields(job, "environment_used")
    return program_exits.on_started(job, report, _at(report))


def _lab_activity(job: Job, report: LabActivity) -> str:
    """A session's Jupyter was active (a kernel, a request) or has a client connected:
    its ``last_activity_at`` moves forward (never past now: an agent's clock may run ahead)."""
    when = min(datetime.fromtimestamp(report.active_at, tz=UTC), timezone.now())
    note_activity(job.pk, when)
    return "lab activity"


_HANDLERS: dict[type[Report], Callable[[Job, Any], str]] = {
    LabActivity: _lab_activity,
    Progress: _progress,
    ScaleDone: _scale_done,
    Recovered: _recovered,
    WorkerFailed: _worker_failed,
    Straggler: _straggler,
    ProfileDone: _profile_done,
    Finished: _finished,
    Failed: _failed,
    WorkerExited: _worker_exited,
    Started: _started,
    LogLines: log_lines,
    ArtifactStored: outputs.artifact_stored,
    CheckpointSkipped: outputs.checkpoint_skipped,
    Metrics: outputs.metrics,
    EventsDropped: events_dropped,
}
