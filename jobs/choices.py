"""Enumerations of the jobs app, and the lifecycle's allowed transitions."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    """Where a job is in its life: pending → queued → running ⇄ scaling → terminal."""

    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SCALING = "scaling", "Scaling"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class DependencyKind(models.TextChoices):
    """How a job's dependency must end for the job to start (``jobs.dependencies``).

    The rule itself (met, waiting or never) is ``scheduler.dependencies``'s.
    """

    AFTER_OK = "after_ok", "After it completes"
    AFTER_ANY = "after_any", "After it ends, however"
    AFTER_FAILED = "after_failed", "After it fails"


class Launcher(models.TextChoices):
    """How a job's processes are started (``workers.program``); built-in workloads use edl."""

    EDL = "edl", "edl (elastic SDK: resized without stopping)"
    TORCHRUN = "torchrun", "torchrun (unmodified DDP: a resize restarts it)"
    SESSION = "session", "session (the agent runs a Jupyter server: interactive)"


class JobKind(models.TextChoices):
    """What a job is for: a batch run, or an interactive session (``jobs.sessions``).

    A session is a fixed-size job (``gpus == min_gpus == max_gpus``, never scaled) whose
    agent starts a Jupyter server for a person at the keyboard; it ends when its user stops
    it, when it idles past ``idle_timeout_s`` (culled) or at its lifetime (``max_runtime_s``).
    """

    BATCH = "batch", "Batch job"
    SESSION = "session", "Interactive session"


class LabAccess(models.TextChoices):
    """Who may open a session's JupyterLab: only the user who started it, or any member
    of its tenant who may submit jobs (owners and members; viewers never)."""

    CREATOR = "creator", "Only its creator"
    TENANT = "tenant", "Members of its tenant"


class RecoveryMode(models.TextChoices):
    """How a job recovers from a lost worker (EDL §4)."""

    CONSISTENT = "consistent", "Consistent (restore the latest checkpoint)"
    APPROXIMATE = "approximate", "Approximate (survivors redo the current mini-batch)"


class EventKind(models.TextChoices):
    """What a JobEvent records."""

    SUBMITTED = "submitted", "Submitted"
    STATE = "state", "State changed"
    SCALED = "scaled", "Parallelism changed"
    PRIORITY = "priority", "Priority changed"
    RANGE = "range", "Elastic range changed"
    PREEMPTED = "preempted", "Preempted"
    MIGRATED = "migrated", "Migrated"
    STRAGGLER = "straggler", "Straggler reported"
    RECOVERED = "recovered", "Recovered from a failure"
    PROFILED = "profiled", "Throughput profiled"
    NOTE = "note", "Note"
    WARNING = "warning", "Warning"
    EXPIRED = "expired", "Outputs expired"
    RETRIED = "retried", "Requeued after a failure"
    LIMITS = "limits", "Restart or run-time limit changed"


class ArtifactKind(models.TextChoices):
    """What a stored object of a job is (``jobs.models.Artifact``)."""

    CHECKPOINT = "checkpoint", "Checkpoint"
    FINAL = "final", "Final checkpoint"
    USER = "user", "Artifact"
    LOG = "log", "Log"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.RUNNING, JobState.SCALING})

# running → queued is a preemption (Tiresias); scaling → queued likewise.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.PENDING: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.SCALING, JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SCALING: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def can_transition(source: str, target: str) -> bool:
    """Whether the lifecycle allows ``source → target``."""
    return target in ALLOWED_TRANSITIONS.get(source, frozenset())
