"""What-if: replay a trace through the simulator under several policies, as a Celery task.

    page (POST) ──> start_run(): parameters (and an uploaded trace) stored under a run id
                       │ on commit, to Celery queue "whatif" (its own worker: a long
                       │ simulation never delays the tick or the agents' reports on "portal")
                       ▼
    Celery: run_whatif(run_id) ── for each policy: scheduler.simulator.simulate ── progress
                       │ soft time limit WHATIF_SOFT_TIME_LIMIT_SECONDS: stopped, "failed"
    page polls GET /whatif/<run>.json ── progress bar, then the comparison report

Bounded: at most ``WHATIF_MAX_TRACE_JOBS`` jobs in a trace (an upload beyond it
is refused; the cluster's history is cut to its newest jobs), at most
``WHATIF_MAX_GPUS`` GPUs and ``WHATIF_MAX_LEAVES`` leaves in the simulated
cluster; the form says so, and the task checks again.

Traces: the cluster's own completed jobs (submit offset, requested GPUs, run
time), the shared Tiresias trace ``60_job.csv``, or an uploaded CSV in the
Tiresias format.  Runs live in the cache (Redis) for a day: they are reports,
not records.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django import forms
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from fabric.errors import TopologyError
from inventory.services import current_spec
from jobs.choices import JobState
from jobs.models import Job
from scheduler.fabric_placement import fabric_spec_for
from scheduler.policies import REGISTRY, get_policy
from scheduler.policies.base import Policy, PolicyCore
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import TraceError, TraceJob, load_tiresias, shared_trace

log = logging.getLogger(__name__)

WHATIF_QUEUE = "whatif"
HARD_LIMIT_GRACE_S = 30  # after the soft limit, the time the task has to record its failure
RUN_TTL_S = 24 * 3600
MAX_UPLOAD_BYTES = 2 * 1024 * 1024
CDF_POINTS = 200
SERIES_POINTS = 300
PLACEMENTS = (
    ("count", "GPU count (no network)"),
    ("vclos", "vClos (isolated links)"),
    ("ecmp", "ECMP (hashed uplinks)"),
)
PLACEMENT_NAMES = {"count": "GPU count", "vclos": "vClos", "ecmp": "ECMP"}
"""Short names of the placements, for headings and table rows."""
POLICY_NAMES = {
    "fifo": "FIFO",
    "srtf": "SRTF",
    "tiresias": "Tiresias",
    "dlas": "2D-LAS",
    "elastic-tiresias": "Elastic Tiresias",
}
"""How the policies are written for people (the registry's keys are for machines)."""
PROGRESS_EVERY_S = 0.5  # wall seconds between progress writes to the cache


def run_label(policy: str, placement: str) -> str:
    """A comparison row's name: "Tiresias", or "Tiresias on vClos" off the GPU-count model."""
    name = POLICY_NAMES.get(policy, policy)
    return (
        name if placement == "count" else f"{name} on {PLACEMENT_NAMES.get(placement, placement)}"
    )


def run_title(params: dict[str, Any]) -> str:
    """A run's heading: "FIFO vs Tiresias", with the placements unless only GPU count."""
    policies = " vs ".join(POLICY_NAMES.get(p, p) for p in params.get("policies") or [])
    placements = list(params.get("placements") or ["count"])
    if placements == ["count"]:
        return policies
    return f"{policies} ({', '.join(PLACEMENT_NAMES.get(p, p) for p in placements)})"


def simulated_horizon(trace: tuple[TraceJob, ...], total_gpus: int) -> float:
    """Roughly how long (simulated seconds) replaying ``trace`` takes: for the progress bar.

    At least until the last job could end if it started on arrival, and at least the
    trace's GPU-seconds spread over the whole cluster.
    """
    if not trace:
        return 1.0
    first = min(j.submit for j in trace)
    arrivals = max(j.submit + j.duration for j in trace) - first
    work = sum(j.gpus * j.duration for j in trace) / max(total_gpus, 1)
    return max(arrivals, work, 1.0)


class WatchedPolicy:
    """A policy whose cores tell ``on_time`` the simulated time of each scheduling pass.

    Everything else is the wrapped policy's; the simulator cannot tell them apart.
    """

    def __init__(self, policy: Policy, on_time: Callable[[float], None]) -> None:
        self._policy = policy
        self._on_time = on_time

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def new_core(self, total_gpus: int) -> PolicyCore:
        """The wrapped policy's core, its ``decide`` reporting the time first."""
        core = self._policy.new_core(total_gpus)
        decide = core.decide

        def watched(now: float) -> Any:
            self._on_time(now)
            return decide(now)

        core.decide = watched  # type: ignore[method-assign]
        return core


SOURCES = (
    ("history", "This cluster's completed jobs"),
    ("60_job", "Shared Tiresias trace (60 jobs)"),
    ("upload", "Upload a trace (Tiresias CSV)"),
)


def available_policies() -> list[str]:
    """Policy names whose implementation is importable here."""
    names = []
    for name in REGISTRY:
        try:
            get_policy(name)
        except (ImportError, TypeError, ValueError):
            continue
        names.append(name)
    return names


class WhatIfForm(forms.Form):
    """What to simulate: a trace, policies and placements to compare, the cluster, elasticity."""

    source = forms.ChoiceField(choices=SOURCES, widget=forms.RadioSelect, initial="history")
    upload = forms.FileField(required=False, label="Trace file", help_text="Tiresias CSV format.")
    policies = forms.MultipleChoiceField(
        choices=(), widget=forms.CheckboxSelectMultiple, label="Policies to compare"
    )
    total_gpus = forms.IntegerField(min_value=1, max_value=100_000, label="GPUs")
    gpus_per_server = forms.IntegerField(min_value=1, max_value=64, label="GPUs/server")
    placements = forms.MultipleChoiceField(
        choices=PLACEMENTS,
        widget=forms.CheckboxSelectMultiple,
        initial=["count"],
        help_text="vClos and ECMP place on a leaf-spine fabric and run the vClos paper's FIFO queue.",
    )
    leaves = forms.IntegerField(
        min_value=1, max_value=4096, label="Leaves", help_text="For vClos/ECMP placement."
    )
    elastic = forms.BooleanField(
        required=False, label="Elastic jobs (EDL: scale between 0.5x and 2x the request)"
    )
    duration_scale = forms.FloatField(
        min_value=0.01, max_value=1000, initial=1.0, label="Duration scale"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = available_policies()
        self.fields["policies"].choices = [  # type: ignore[attr-defined]
            (n, POLICY_NAMES.get(n, n)) for n in names
        ]
        self.fields["policies"].initial = [n for n in ("fifo", "tiresias") if n in names]
        spec = current_spec()
        self.fields["total_gpus"].initial = spec.total_gpus if spec else 64
        self.fields["gpus_per_server"].initial = spec.gpus_per_server if spec else 8
        self.fields["leaves"].initial = spec.leaves if spec else 4

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for field, problem in size_problems(cleaned).items():
            self.add_error(field, problem)
        placements = cleaned.get("placements") or []
        if set(placements) & {"vclos", "ecmp"}:
            total, per, leaves = (
                cleaned.get(k) for k in ("total_gpus", "gpus_per_server", "leaves")
            )
            if total and per and leaves:
                try:
                    fabric_spec_for(total, per, leaves)
                except (ValueError, TopologyError) as exc:
                    self.add_error(
                        "leaves", f"{exc} ({total // per} servers over {leaves} leaves)."
                    )
        upload = cleaned.get("upload")
        if cleaned.get("source") == "upload":
            if upload is None:
                self.add_error("upload", "Choose a trace file to upload.")
            elif upload.size > MAX_UPLOAD_BYTES:
                self.add_error("upload", f"At most {MAX_UPLOAD_BYTES // 1024} KiB.")
            else:
                try:
                    cleaned["upload_text"] = upload.read().decode("utf-8")
                except UnicodeDecodeError:
                    self.add_error("upload", "The file is not UTF-8 text.")
                    return cleaned
                try:
                    trace = _parse_upload(cleaned["upload_text"], 1.0)
                except TraceError as exc:
                    self.add_error("upload", str(exc).split(": ", 1)[-1])
                else:
                    if not trace:
                        self.add_error("upload", "The trace has no usable job.")
                    elif too_long := trace_size_problem(len(trace)):
                        self.add_error("upload", too_long)
        return cleaned


def size_problems(params: dict[str, Any]) -> dict[str, str]:
    """Why the simulated cluster is too large to simulate here, by form field (empty: fine)."""
    problems = {}
    gpus, leaves = params.get("total_gpus"), params.get("leaves")
    if isinstance(gpus, int) and gpus > settings.WHATIF_MAX_GPUS:
        problems["total_gpus"] = f"At most {settings.WHATIF_MAX_GPUS} GPUs can be simulated here."
    if isinstance(leaves, int) and leaves > settings.WHATIF_MAX_LEAVES:
        problems["leaves"] = f"At most {settings.WHATIF_MAX_LEAVES} leaves can be simulated here."
    return problems


def trace_size_problem(jobs: int) -> str | None:
    """Why a trace of ``jobs`` jobs is too long to replay here (None: fine)."""
    limit = int(settings.WHATIF_MAX_TRACE_JOBS)
    if jobs > limit:
        return f"The trace has {jobs} jobs; at most {limit} can be replayed here."
    return None


def _key(run_id: str) -> str:
    return f"whatif:{run_id}"


def get_run(run_id: str) -> dict[str, Any] | None:
    """The run's state: status (queued/running/done/failed), progress 0-1, report or error."""
    state: dict[str, Any] | None = cache.get(_key(run_id))
    return state


def _put(run_id: str, state: dict[str, Any]) -> None:
    cache.set(_key(run_id), state, RUN_TTL_S)


def start_run(params: dict[str, Any], upload_text: str | None = None) -> str:
    """Record a new run and enqueue its task once the current transaction commits."""
    run_id = uuid.uuid4().hex
    _put(
        run_id,
        {"status": "queued", "progress": 0.0, "params": params, "upload": upload_text, "step": ""},
    )
    transaction.on_commit(lambda: enqueue_run(run_id))
    return run_id


def enqueue_run(run_id: str) -> None:
    """Send the run to its queue, with the time limits configured now."""
    soft = int(settings.WHATIF_SOFT_TIME_LIMIT_SECONDS)
    run_whatif.apply_async(
        (run_id,), queue=WHATIF_QUEUE, soft_time_limit=soft, time_limit=soft + HARD_LIMIT_GRACE_S
    )


def _parse_upload(text: str, scale: float) -> tuple[TraceJob, ...]:
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as handle:
        handle.write(text)
        path = Path(handle.name)
    try:
        return load_tiresias(path, duration_scale=scale).jobs
    finally:
        path.unlink(missing_ok=True)


def history_trace(limit: int | None = None) -> tuple[TraceJob, ...]:
    """The cluster's newest ``limit`` completed jobs (default ``WHATIF_MAX_TRACE_JOBS``) as a
    trace: submit offsets, requested GPUs, run times."""
    limit = int(settings.WHATIF_MAX_TRACE_JOBS) if limit is None else limit
    newest = list(
        Job.objects.filter(state=JobState.COMPLETED, started_at__isnull=False)
        .order_by("-submitted_at", "-id")
        .values_list("pk", "submitted_at", "started_at", "finished_at", "gpus", "workload")[:limit]
    )
    rows = newest[::-1]
    if not rows:
        return ()
    first = rows[0][1]
    return tuple(
        TraceJob(
            id=str(pk),
            submit=(submitted - first).total_seconds(),
            gpus=gpus,
            duration=max(1.0, (finished - started).total_seconds()),
            model="",
        )
        for pk, submitted, started, finished, gpus, _ in rows
    )


def load_trace(params: dict[str, Any], upload: str | None) -> tuple[TraceJob, ...]:
    """The trace a run replays."""
    scale = float(params.get("duration_scale", 1.0))
    source = params["source"]
    if source == "history":
        jobs = history_trace()
        return tuple(
            TraceJob(j.id, j.submit, j.gpus, j.duration * scale, j.model, j.tenant) for j in jobs
        )
    if source == "60_job":
        return load_tiresias(shared_trace("60_job.csv"), duration_scale=scale).jobs
    if source == "upload" and upload is not None:
        trace = _parse_upload(upload, scale)
        if problem := trace_size_problem(len(trace)):
            raise TraceError(problem)
        return trace
    raise TraceError(f"unknown trace source {source!r}")


def _thin(values: list[Any], points: int) -> list[Any]:
    if len(values) <= points:
        return values
    step = (len(values) - 1) / (points - 1)
    return [values[round(i * step)] for i in range(points)]


def compare(
    trace: tuple[TraceJob, ...],
    params: dict[str, Any],
    on_progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """Simulate ``trace`` under every chosen policy; the comparison report (plain JSON).

    ``on_progress(fraction, words)`` hears how far the whole comparison is, by
    simulated time within each run (runs count equally).
    """
    if problems := size_problems(params):
        raise ValueError(" ".join(problems.values()))
    cfg = SimConfig(
        total_gpus=int(params["total_gpus"]),
        gpus_per_server=int(params["gpus_per_server"]),
        elastic=bool(params.get("elastic")),
    )
    too_wide = [j for j in trace if j.gpus > cfg.total_gpus]
    runnable = tuple(j for j in trace if j.gpus <= cfg.total_gpus)
    runs = [
        (policy, placement)
        for policy in params["policies"]
        for placement in params.get("placements") or ["count"]
    ]  # every policy on every placement: one simulator loop serves them all
    results = []
    horizon = simulated_horizon(runnable, cfg.total_gpus)
    first = min((j.submit for j in runnable), default=0.0)
    for index, (name, placement) in enumerate(runs):
        label = run_label(name, placement)
        policy = get_policy(name)
        if on_progress is not None:
            on_progress(index / len(runs), f"Simulating {label} ({index + 1} of {len(runs)})")
            policy = cast(Policy, WatchedPolicy(policy, _time_reporter(
                on_progress, index, len(runs), label, first, horizon
            )))  # fmt: skip
        if placement == "count":
            result = simulate(runnable, policy, cfg)
        else:
            spec = fabric_spec_for(cfg.total_gpus, cfg.gpus_per_server, int(params["leaves"]))
            on_fabric = replace(cfg, placement=placement, fabric=spec)
            result = simulate(runnable, policy, on_fabric)
        jcts = sorted(r.jct for r in result.jobs)
        series = result.series
        keep = _thin(list(range(len(series.get("t", [])))), SERIES_POINTS)
        results.append(
            {
                "policy": name if placement == "count" else f"{name} / {placement}",
                "label": label,
                "summary": result.summary,
                "jct_cdf": _thin(jcts, CDF_POINTS),
                "series": {k: [v[i] for i in keep] for k, v in series.items()},
            }
        )
    return {
        "jobs": len(runnable),
        "dropped_too_wide": len(too_wide),
        "total_gpus": cfg.total_gpus,
        "elastic": cfg.elastic,
        "results": results,
    }


def _time_reporter(
    on_progress: Callable[[float, str], None],
    index: int,
    runs: int,
    label: str,
    first: float,
    horizon: float,
) -> Callable[[float], None]:
    """``on_time(now)`` for run ``index``: the bar's share by simulated time, twice a second."""
    last = [0.0]

    def on_time(now: float) -> None:
        wall = time.monotonic()
        if wall - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = wall
        done = min(max(now - first, 0.0) / horizon, 0.99)
        words = (
            f"Simulating {label} ({index + 1} of {runs}): "
            f"{(now - first) / 3600:.1f} h of about {horizon / 3600:.1f} h simulated"
        )
        on_progress((index + done) / runs, words)

    return on_time


@shared_task(name="portal.whatif.run", ignore_result=True)
def run_whatif(run_id: str) -> None:
    """Run one what-if comparison; progress and the report go to the run's cache entry."""
    state = get_run(run_id)
    if state is None or state["status"] != "queued":
        return
    params = state["params"]

    def on_progress(fraction: float, words: str) -> None:
        state.update(status="running", progress=round(fraction, 4), step=words)
        _put(run_id, state)

    try:
        trace = load_trace(params, state.get("upload"))
        if not trace:
            raise TraceError("the trace has no job to replay (no completed job yet?)")
        report = compare(trace, params, on_progress)
    except (TraceError, ValueError) as exc:
        state.update(status="failed", error=str(exc), upload=None)
        _put(run_id, state)
        return
    except SoftTimeLimitExceeded:
        message = (
            "stopped: the simulation ran past its time limit (WHATIF_SOFT_TIME_LIMIT_SECONDS); "
            "try a shorter trace or fewer policies"
        )
        state.update(status="failed", error=message, upload=None)
        _put(run_id, state)
        return
    except Exception as exc:  # a bug must still end the progress bar, with a message
        log.exception("what-if run %s failed", run_id)
        state.update(status="failed", error=f"internal error: {type(exc).__name__}", upload=None)
        _put(run_id, state)
        return
    state.update(status="done", progress=1.0, step="", report=report, upload=None)
    _put(run_id, state)
