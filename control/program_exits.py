"""How a tenant program's processes ending moves its job (the control plane's side).

The elastic runtime reports a job's end itself (``finished``/``failed``
events); a ``torchrun`` program has no runtime, so, as torchrun does, the job
ends from its processes' exits:

* every worker of the current run exits 0 → completed;
* any worker of the current run crashes (non-zero exit, a signal, a sandbox
  limit) → failed, with the agent's diagnosis and the last line it printed
  (or requeued while the job has restarts left: ``endings.fail_or_retry``);
* exits of an earlier run (stopped for a resize) change nothing.

An ``edl`` program whose worker crashes before the job made any progress
(an import error, a missing file, a limit hit while loading) fails the job
too: nobody else would report it.  After that, a crash is the runtime's to
recover from, as for the built-in workloads.
"""

from __future__ import annotations

from datetime import datetime

from control.endings import complete_job, fail_or_retry
from jobs import holdings
from jobs.agent_commands import worker_id
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.lifecycle import broadcast, record, save_fields, transition
from jobs.models import Job
from workers.protocol import Started, WorkerExited


def on_started(job: Job, report: Started, now: datetime) -> str:
    """A restarted torchrun run is up: the job runs again at its new size."""
    if not job.restarts_to_resize or job.state != JobState.SCALING:
        return "noted"
    size = len(holdings.held_gpus(job))
    transition(job, JobState.RUNNING, reason=f"torchrun run {job.generation} started", at=now,
               parallelism=size)  # fmt: skip
    broadcast(job, "job.updated")
    return "restarted"


def on_worker_exited(job: Job, report: WorkerExited, now: datetime) -> str | None:
    """Apply the exit to a program's job; None when it is not one this module decides."""
    if job.code_id is None or job.state not in ACTIVE_STATES:
        return None
    if job.restarts_to_resize:
        if report.generation is not None and report.generation != job.generation:
            return "earlier run"
        if report.outcome == "clean":
            return _clean_exit(job, report.worker_id, now)
        if report.outcome in ("crashed", "lost"):
            return _fail(job, _why(report), now)
        return None
    if report.outcome == "crashed" and job.step == 0 and job.samples_per_s is None:
        return _fail(job, _why(report) + " before training started", now)
    return None


def _clean_exit(job: Job, worker: str, now: datetime) -> str:
    done = sorted({*job.finished_workers, worker})
    job.finished_workers = done
    everyone = {worker_id(g) for g in holdings.held_gpus(job)}
    if not everyone <= set(done):
        save_fields(job, "finished_workers")
        return "worker done"
    complete_job(job, f"all {len(everyone)} workers of run {job.generation} exited 0", now)
    return "completed"


def _why(report: WorkerExited) -> str:
    code = "a signal" if report.exit_code is None else f"exit {report.exit_code}"
    if report.exit_code is not None and report.exit_code < 0:
        code = f"signal {-report.exit_code}"
    why = f"worker {report.worker_id} {report.outcome} ({code})"
    if report.reason:
        why += f": {report.reason}"
    last = [line for line in report.log_tail.splitlines() if line.strip()]
    if last and not report.reason:
        why += f"; last output: {last[-1].strip()[:200]}"
    return why


def _fail(job: Job, why: str, now: datetime) -> str:
    """The program failed: retried while the job has restarts left, else the job fails."""
    record(job, EventKind.NOTE, now, reason=why[:500])
    return fail_or_retry(job, why, now)
