"""Hyperparameter sweeps: trials of one program, run, promoted and stopped by a strategy
(``check_*`` validate, ``do_*`` change state; the rule itself is ``scheduler.asha``).

::

    do_submit_sweep          Sweep row, then advance(): the first trials' jobs
    on_trial_job_ended       (jobs.workflow_events, in the transaction that ended the job)
        ├── record           its metric at its last step (TrainingMetric) as the rung's result
        │                    (none yet: the trial waits; on_trial_metrics takes it on arrival)
        └── advance          sweep row locked ─▶ scheduler.asha.next_moves ─▶
                 ├── promote   a NEW job, TRIAL_MAX_STEPS = the next rung's budget,
                 │             resume_from = the trial's previous job (its checkpoint)
                 ├── launch    a new trial: params from the space, its first job
                 ├── stop      the trial ends, the reason in its job's history
                 └── finished  the sweep is completed

A trial's job is an ordinary job whose environment carries the hyperparameters
(``HP_<NAME>``, and all of them as JSON in ``SWEEP_PARAMS``), ``TRIAL_MAX_STEPS``
(train to that step, checkpoint, exit), ``SWEEP_ID`` and ``TRIAL_INDEX``; its
``sched_weight`` is ``eta ** rung`` (``scheduler.asha.weight``), so a promoted
trial claims idle GPUs more strongly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from audit import services as audit
from jobs.artifacts import has_checkpoint
from jobs.choices import TERMINAL_STATES, ArtifactKind, EventKind, JobState
from jobs.errors import JobConflictError, JobError, JobPermissionError, JobValidationError
from jobs.lifecycle import record
from jobs.models import Job, Sweep, SweepState, TrainingMetric, Trial
from jobs.services import JobSpec, check_job_spec, do_cancel_job, do_submit_job
from portalctl.sweep_fields import SWEEP_FIELDS
from scheduler import asha
from scheduler.asha import TrialStatus, TrialView
from tenancy.models import Tenant
from tenancy.services import can_write
from utilities.deadlocks import atomic_retrying

SWEEP_ENV = ("SWEEP_PARAMS", "TRIAL_MAX_STEPS", "SWEEP_ID", "TRIAL_INDEX")
"""Variables a sweep sets in each trial's environment (besides ``HP_<NAME>``)."""
MAX_TRIALS = 1000
MAX_STEPS = 100_000_000
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
LIVE = (TrialStatus.RUNNING, TrialStatus.WAITING)


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep submission: the trials' job, the space and the rule."""

    job: JobSpec
    template: dict[str, Any]
    space: asha.Space
    search_space: dict[str, Any]
    metric: str
    plan: asha.Plan
    seed: int


def _whole(data: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None) -> int:
    value = data.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"A whole number from {lo} to {hi}.")
    return value


AddError = Callable[[str, str], None]
"""Reports one problem of a submission by its field."""


def _gpu_hours(data: Mapping[str, Any], add: AddError) -> float | None:
    hours = data.get("max_gpu_hours")
    if hours is None:
        return None
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours < 1e9:
        add("max_gpu_hours", "A positive number of GPU-hours.")
        return None
    return float(hours)


def _rule_fields(data: Mapping[str, Any], add: AddError) -> dict[str, Any]:
    """The sweep's own fields (``SWEEP_FIELDS``), each problem reported by name."""
    out: dict[str, Any] = {}
    strategy = data.get("strategy", asha.ASHA)
    if strategy not in asha.STRATEGIES:
        add("strategy", f"One of: {', '.join(asha.STRATEGIES)}.")
    out["strategy"] = strategy
    mode = data.get("mode", asha.MINIMIZE)
    if mode not in asha.MODES:
        add("mode", "'min' or 'max'.")
    out["mode"] = mode
    metric = data.get("metric")
    if not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric):
        add("metric", "The name of a metric the program logs ([A-Za-z_][A-Za-z0-9_./-]*).")
    out["metric"] = metric
    bounds = {
        "eta": (2, 100, 3),
        "min_steps": (1, MAX_STEPS, None),
        "max_steps": (1, MAX_STEPS, None),
        "max_trials": (1, MAX_TRIALS, None),
        "seed": (0, 2**62, 0),
    }
    for key, (lo, hi, default) in bounds.items():
        if key == "min_steps" and strategy != asha.ASHA and data.get(key) is None:
            default = 1  # grid and random run every trial to max_steps
        if key == "max_trials" and strategy == asha.GRID and data.get(key) is None:
            continue  # the grid's size
        try:
            out[key] = _whole(data, key, lo, hi, default)
        except ValueError as exc:
            add(key, str(exc))
    if data.get("max_running") is not None:
        try:
            out["max_running"] = _whole(data, "max_running", 1, MAX_TRIALS, None)
        except ValueError as exc:
            add("max_running", str(exc))
    out["max_gpu_hours"] = _gpu_hours(data, add)
    if out.get("min_steps", 0) > out.get("max_steps", MAX_STEPS):
        add("min_steps", "min_steps cannot exceed max_steps.")
    return out


def _job_part(
    tenant: Tenant, data: Mapping[str, Any], add: AddError
) -> tuple[JobSpec | None, dict[str, Any]]:
    """The trials' job: a program (``check_job_spec``) whose env leaves the sweep's names."""
    template = {k: v for k, v in data.items() if k not in SWEEP_FIELDS}
    for key in ("after", "resume_from"):
        if template.get(key) not in (None, "", []):
            add(key, "A sweep's trials take no " + key + ": the sweep starts and resumes them.")
        template.pop(key, None)
    if template.get("workload") and not template.get("code"):
        add("workload", "A sweep runs a program (code, entrypoint, launcher).")
    spec = None
    try:
        spec = check_job_spec(tenant=tenant, data=template)
    except JobValidationError as exc:
        for field, messages in exc.errors.items():
            for message in messages:
                add(field, message)
    if spec is not None and spec.program is None:
        add("code", "A sweep runs a program (code, entrypoint, launcher).")
    env = spec.program.env if spec is not None and spec.program is not None else {}
    taken = [name for name in env if name in SWEEP_ENV or name.startswith("HP_")]
    if taken:
        add("env", f"{', '.join(taken)}: set by the sweep for each trial.")
    if spec is not None and spec.program is not None:
        template["env"] = dict(spec.program.env)  # NAME=value lines, as a checked object
    return spec, template


def check_sweep_spec(*, tenant: Tenant, data: Mapping[str, Any]) -> SweepSpec:
    """Validate a sweep submission for ``tenant``: a program's job fields plus the search
    space, metric, mode, strategy, eta, steps and budget; every problem by its field
    (``JobValidationError``), nothing created."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    rule = _rule_fields(data, add)
    space = None
    try:
        space = asha.check_space(data.get("search_space"), str(rule["strategy"]))
    except asha.SpaceError as exc:
        add(exc.field, exc.message)
    spec, template = _job_part(tenant, data, add)
    if errors:
        field, messages = next(iter(errors.items()))
        raise JobValidationError(f"{field}: {messages[0]}", errors)
    assert space is not None and spec is not None
    trials = rule.get("max_trials") or min(space.grid_size, MAX_TRIALS)
    plan = asha.Plan(
        strategy=rule["strategy"],
        mode=rule["mode"],
        eta=rule["eta"],
        min_steps=rule["min_steps"],
        max_steps=rule["max_steps"],
        max_trials=trials,
        max_gpu_hours=rule["max_gpu_hours"],
        max_running=rule.get("max_running"),
    )
    raw_space = cast(dict[str, Any], data["search_space"])
    return SweepSpec(spec, template, space, raw_space, rule["metric"], plan, rule["seed"])


@transaction.atomic
def do_submit_sweep(
    *, user: AbstractBaseUser | AnonymousUser, tenant: Tenant, spec: SweepSpec
) -> Sweep:
    """Create a sweep for ``tenant`` and start its first trials."""
    if not can_write(user, tenant):
        raise JobPermissionError(f"you cannot submit jobs to tenant {tenant.slug!r}")
    assert spec.job.program is not None
    now = timezone.now()
    plan = spec.plan
    sweep = Sweep.objects.create(
        tenant=tenant,
        submitter_id=cast(int, user.pk),
        name=spec.job.name,
        code=spec.job.program.bundle,
        job_template=spec.template,
        search_space=spec.search_space,
        metric=spec.metric,
        mode=plan.mode,
        strategy=plan.strategy,
        eta=plan.eta,
        min_steps=plan.min_steps,
        max_steps=plan.max_steps,
        max_trials=plan.max_trials,
        max_gpu_hours=plan.max_gpu_hours,
        max_running=plan.max_running,
        seed=spec.seed,
        created_at=now,
    )
    audit.record(
        "sweep.submit",
        obj=sweep,
        tenant=tenant,
        user=user,
        after={"name": sweep.name, "strategy": sweep.strategy, "max_trials": sweep.max_trials},
    )
    advance(sweep.pk, at=now)
    return sweep


def plan_of(sweep: Sweep) -> asha.Plan:
    """The sweep's rule, as the pure core takes it."""
    return asha.Plan(
        strategy=sweep.strategy,
        mode=sweep.mode,
        eta=sweep.eta,
        min_steps=sweep.min_steps,
        max_steps=sweep.max_steps,
        max_trials=sweep.max_trials,
        max_gpu_hours=sweep.max_gpu_hours,
        max_running=sweep.max_running,
    )


def trial_view(trial: Trial) -> TrialView:
    """A trial as the pure core sees it."""
    results = {int(rung): float(value) for rung, value in trial.results.items()}
    return TrialView(trial.index, trial.rung, TrialStatus(trial.status), results)


def trial_env(sweep: Sweep, trial: Trial, steps: int) -> dict[str, str]:
    """The trial's job's variables: the template's, the hyperparameters, its step budget."""
    env = dict(sweep.job_template.get("env") or {})
    env.update({f"HP_{name.upper()}": str(value) for name, value in trial.params.items()})
    env["SWEEP_PARAMS"] = json.dumps(trial.params, sort_keys=True)
    env["TRIAL_MAX_STEPS"] = str(steps)
    env["SWEEP_ID"] = str(sweep.pk)
    env["TRIAL_INDEX"] = str(trial.index)
    return env


def _start_job(sweep: Sweep, trial: Trial, at: datetime, resume_from: int | None) -> Job:
    """Submit the trial's job for its current rung (``JobError`` when refused)."""
    steps = plan_of(sweep).rungs[trial.rung]
    body = {**sweep.job_template, "env": trial_env(sweep, trial, steps)}
    body["name"] = f"{sweep.name} #{trial.index} r{trial.rung}"[:100]
    if resume_from is not None:
        body["resume_from"] = resume_from
    spec = check_job_spec(tenant=sweep.tenant, data=body)
    job = do_submit_job(
        user=sweep.submitter,
        tenant=sweep.tenant,
        spec=spec,
        at=at,
        trial=trial,
        sched_weight=asha.weight(trial.rung, sweep.eta),
    )
    trial.job = job
    trial.status = TrialStatus.RUNNING
    trial.save(update_fields=["job", "status", "rung"])
    return job


def _launch(sweep: Sweep, index: int, at: datetime) -> bool:
    """Create trial ``index`` and its first job; False (nothing created) when the tenant's
    queue is full: the next end tries again."""
    space = asha.check_space(sweep.search_space, sweep.strategy)
    params = asha.trial_params(space, index, sweep.seed)
    try:
        with transaction.atomic():
            trial = Trial.objects.create(sweep=sweep, index=index, params=params)
            _start_job(sweep, trial, at, resume_from=None)
    except JobConflictError:
        return False
    except JobError as exc:
        Trial.objects.create(
            sweep=sweep, index=index, params=params, status=TrialStatus.FAILED,
            reason=f"its job was refused: {exc}"[:300],
        )  # fmt: skip
    return True


def _promote(sweep: Sweep, trial: Trial, move: asha.Promote, at: datetime) -> None:
    """Run the trial on to ``move.rung`` in a new job resumed from its previous one's newest
    checkpoint; a program that left none trains the new job from step 0 (its history says)."""
    previous = trial.job
    assert previous is not None  # a trial that reported a result had a job
    resumable = has_checkpoint(previous)
    trial.rung = move.rung
    try:
        with transaction.atomic():
            job = _start_job(sweep, trial, at, resume_from=previous.pk if resumable else None)
    except JobError as exc:
        trial.status, trial.reason = TrialStatus.FAILED, f"promotion refused: {exc}"[:300]
        trial.save(update_fields=["status", "reason", "rung"])
        return
    note = f"sweep {sweep.pk}: trial {trial.index} promoted to rung {move.rung} as job {job.pk}"
    record(previous, EventKind.NOTE, at, note)
    if not resumable:
        record(job, EventKind.NOTE, at, f"job {previous.pk} left no checkpoint: from step 0")


def _stop(trial: Trial, reason: str, at: datetime) -> None:
    """End the trial: its waiting job's history says why."""
    trial.status, trial.reason = TrialStatus.STOPPED, reason[:300]
    trial.save(update_fields=["status", "reason"])
    if trial.job is not None:
        record(trial.job, EventKind.NOTE, at, f"sweep {trial.sweep_id} stopped trial "
               f"{trial.index}: {reason}")  # fmt: skip


def gpu_hours_used(sweep: Sweep) -> float:
    """GPU-hours the sweep's trial jobs have attained so far."""
    total = Job.objects.filter(trial__sweep=sweep).aggregate(s=Sum("attained_gpu_seconds"))["s"]
    return float(total or 0.0) / 3600.0


def advance(sweep_id: int, *, at: datetime) -> Sweep:
    """Ask the rule what to do now and do it (the sweep row locked: one at a time)."""
    sweep: Sweep = (
        Sweep.objects.select_for_update(of=("self",))
        .select_related("tenant", "submitter")
        .get(pk=sweep_id)
    )
    if sweep.state != SweepState.RUNNING:
        return sweep
    trials = {t.index: t for t in Trial.objects.filter(sweep=sweep).select_related("job")}
    views = [trial_view(trials[i]) for i in sorted(trials)]
    decided = asha.next_moves(plan_of(sweep), views, gpu_hours_used(sweep))
    for move in decided.promote:
        _promote(sweep, trials[move.index], move, at)
    for stop in decided.stop:
        _stop(trials[stop.index], stop.reason, at)
    for index in decided.launch:
        if not _launch(sweep, index, at):
            break
    if decided.finished:
        sweep.state, sweep.finished_at = SweepState.COMPLETED, at
        sweep.save(update_fields=["state", "finished_at"])
    return sweep


def rung_result(job: Job, metric: str) -> float | None:
    """The metric ``job`` logged at its last step (None: it logged none)."""
    row = (
        TrainingMetric.objects.filter(job=job, name=metric)
        .order_by("-step", "-id")
        .values_list("value", flat=True)
        .first()
    )
    return None if row is None else float(row)


def _locked_trial(job: Job, trial_id: int) -> Trial | None:
    """Trial ``trial_id``, locked (its sweep's row first), if ``job`` is its current, still
    running attempt; None otherwise."""
    sweep_id = Trial.objects.filter(pk=trial_id).values_list("sweep_id", flat=True).get()
    list(Sweep.objects.select_for_update().filter(pk=sweep_id).values_list("pk"))
    trial = Trial.objects.select_for_update(of=("self",)).select_related("sweep").get(pk=trial_id)
    if trial.job_id != job.pk or trial.status != TrialStatus.RUNNING:
        return None  # a superseded attempt, or the sweep ended it already
    return trial


def _record_result(trial: Trial, job: Job, at: datetime) -> None:
    """Take the completed job's metric as its rung's result and advance the sweep; with no
    metric yet (its last report may come after its end) the trial waits for it."""
    value = rung_result(job, trial.sweep.metric)
    if value is None:
        trial.reason = f"job {job.pk} ended; waiting for its {trial.sweep.metric!r}"[:300]
        trial.save(update_fields=["reason"])
        return
    trial.results = {**trial.results, str(trial.rung): value}
    trial.best_metric = value
    top = len(plan_of(trial.sweep).rungs) - 1
    trial.status = TrialStatus.COMPLETED if trial.rung == top else TrialStatus.WAITING
    trial.reason = ""
    trial.save(update_fields=["status", "reason", "results", "best_metric"])
    advance(trial.sweep_id, at=at)


def on_trial_job_ended(*, job: Job, at: datetime) -> None:
    """A trial's current job ended: record its rung's result (or its failure) and advance
    the sweep.  Called for every end (``jobs.workflow_events``); other jobs: nothing."""
    if job.trial_id is None:
        return
    trial = _locked_trial(job, job.trial_id)
    if trial is None:
        return
    if job.state == JobState.COMPLETED:
        _record_result(trial, job, at)
        return
    trial.status, trial.reason = TrialStatus.FAILED, f"job {job.pk} {job.state}"
    trial.save(update_fields=["status", "reason"])
    advance(trial.sweep_id, at=at)


def on_trial_metrics(*, job: Job, at: datetime) -> None:
    """Metrics of a trial's job arrived (``jobs.training_metrics``, job row locked): when the
    job has already completed, they are the result its trial waits for."""
    if job.trial_id is None or job.state != JobState.COMPLETED:
        return
    trial = _locked_trial(job, job.trial_id)
    if trial is not None:
        _record_result(trial, job, at)


@atomic_retrying()
def do_cancel_sweep(
    *, user: AbstractBaseUser | AnonymousUser, sweep_id: int, reason: str = ""
) -> Sweep:
    """Cancel the sweep: its running trials' jobs are cancelled, every live trial stopped
    (a 409 once it has ended).

    The live trials' jobs are locked before the sweep, the order a job's end takes
    (job, then its sweep), so a trial ending meanwhile mostly waits; a promotion
    or stop that touches another trial's job can still cross it, and the side
    PostgreSQL aborts to break that deadlock is this one run again
    (``utilities.deadlocks``) or the report, which its task retries.
    """
    live_jobs = Trial.objects.filter(sweep_id=sweep_id, status__in=LIVE).values("job_id")
    list(Job.objects.select_for_update().filter(pk__in=live_jobs).order_by("pk").values("pk"))
    sweep: Sweep = (
        Sweep.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=sweep_id)
    )
    if not can_write(user, sweep.tenant):
        raise JobPermissionError("your role in this tenant is read-only")
    if sweep.state != SweepState.RUNNING:
        raise JobConflictError(f"sweep {sweep.pk} is already {sweep.state}")
    why = reason or f"sweep {sweep.pk} cancelled by {user.get_username()}"
    now = timezone.now()
    sweep.state, sweep.finished_at, sweep.reason = SweepState.CANCELLED, now, why[:300]
    sweep.save(update_fields=["state", "finished_at", "reason"])
    live = Trial.objects.filter(sweep=sweep, status__in=LIVE).select_related("job")
    for trial in live:
        trial.status, trial.reason = TrialStatus.STOPPED, why[:300]
        trial.save(update_fields=["status", "reason"])
        if trial.job is not None and trial.job.state not in TERMINAL_STATES:
            do_cancel_job(user=user, job_id=trial.job.pk, reason=why)
    audit.record("sweep.cancel", obj=sweep, tenant=sweep.tenant, user=user,
                 after={"reason": why})  # fmt: skip
    return sweep


def best_trial(sweep: Sweep, trials: list[Trial]) -> Trial | None:
    """The sweep's best trial so far (the best result at the highest rung reached)."""
    found = asha.best(plan_of(sweep), [trial_view(t) for t in trials])
    return None if found is None else next(t for t in trials if t.index == found.index)


__all__ = [
    "SWEEP_ENV",
    "SweepSpec",
    "advance",
    "best_of",
    "best_trial",
    "check_sweep_spec",
    "do_cancel_sweep",
    "do_submit_sweep",
    "gpu_hours_used",
    "metric_curves",
    "on_trial_job_ended",
    "on_trial_metrics",
    "plan_of",
    "trial_env",
    "trial_rows",
    "trial_view",
]


def trial_rows(sweep: Sweep) -> list[dict[str, Any]]:
    """Each trial as the API and the page show it: params, rung, status, results, metric and
    its current job (id, state, GPUs held), in one query."""
    rows = Trial.objects.filter(sweep=sweep).select_related("job").order_by("index")
    return [
        {
            "index": t.index,
            "params": t.params,
            "rung": t.rung,
            "status": t.status,
            "reason": t.reason,
            "results": t.results,
            "metric": t.best_metric,
            "job": t.job_id,
            "job_state": t.job.state if t.job else "",
            "gpus": t.job.parallelism if t.job else 0,
            "sched_weight": t.job.sched_weight if t.job else 1.0,
        }
        for t in rows
    ]


def best_of(sweep: Sweep) -> dict[str, Any] | None:
    """The best trial so far, with its current job's newest checkpoint (final first):
    ``{"index", "params", "metric", "job", "checkpoint"}`` (None: no result yet)."""
    trials = list(Trial.objects.filter(sweep=sweep).select_related("job"))
    trial = best_trial(sweep, trials)
    if trial is None:
        return None
    checkpoint = None
    if trial.job is not None:
        checkpoint = (
            trial.job.artifacts.filter(kind__in=(ArtifactKind.FINAL, ArtifactKind.CHECKPOINT))
            .order_by(F("step").desc(nulls_last=True), "-id")
            .values("id", "step", "kind")
            .first()
        )
    return {
        "index": trial.index,
        "params": trial.params,
        "metric": trial.best_metric,
        "job": trial.job_id,
        "checkpoint": checkpoint,
    }


MAX_CURVE_POINTS = 20_000
"""The most (step, value) pairs :func:`metric_curves` returns, over all trials."""


def metric_curves(sweep: Sweep) -> dict[int, list[list[float]]]:
    """Each trial's metric against step, over all its jobs (a promoted job goes on from its
    checkpoint's step): ``{index: [[step, value], ...]}``, in one query, bounded."""
    rows = (
        TrainingMetric.objects.filter(job__trial__sweep=sweep, name=sweep.metric)
        .order_by("job__trial__index", "step", "id")
        .values_list("job__trial__index", "step", "value")[:MAX_CURVE_POINTS]
    )
    curves: dict[int, list[list[float]]] = {}
    for index, step, value in rows:
        curves.setdefault(index, []).append([step, value])
    return curves
