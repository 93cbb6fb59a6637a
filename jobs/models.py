"""Jobs and their history.

A Job belongs to a tenant and a submitter; every change of state or parallelism
is written as a JobEvent by the services in ``jobs.services`` (the only writers).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models

from jobs.choices import (
    ArtifactKind,
    DependencyKind,
    EventKind,
    JobKind,
    JobState,
    LabAccess,
    Launcher,
    RecoveryMode,
)
from tenancy.models import Tenant, TenantOwnedQuerySet


class JobQuerySet(TenantOwnedQuerySet):
    """Queries over jobs; ``restrict(user)`` scopes them to the user's tenants."""


class JobArrayQuerySet(TenantOwnedQuerySet):
    """Queries over job arrays; ``restrict(user)`` scopes them to the user's tenants."""


class JobArray(models.Model):
    """N tasks of one program submitted at once (``jobs.arrays``): each task is a Job with
    ``TASK_ID`` and ``TASK_COUNT`` in its environment; ``max_running`` caps how many of them
    are queued or running at once (the others wait, pending, for a slot)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="job_arrays")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="submitted_arrays"
    )
    name = models.CharField(max_length=100)
    size = models.PositiveIntegerField(help_text="Tasks: TASK_ID runs from 0 to size - 1.")
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tasks queued or running at once (null: no cap)."
    )
    created_at = models.DateTimeField(db_index=True)

    objects = JobArrayQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(size__gte=1), name="array_size_positive"),
            models.CheckConstraint(
                condition=models.Q(max_running__isnull=True) | models.Q(max_running__gte=1),
                name="array_cap_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"array {self.pk} ({self.name}, {self.size} tasks)"


class SweepState(models.TextChoices):
    """Where a sweep stands."""

    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    CANCELLED = "cancelled", "Cancelled"


class SweepQuerySet(TenantOwnedQuerySet):
    """Queries over sweeps; ``restrict(user)`` scopes them to the user's tenants."""


class Sweep(models.Model):
    """A hyperparameter search (``jobs.sweeps``): trials of one program, each a job with its
    hyperparameters in its environment, run and stopped by a strategy (grid, random, ASHA)
    toward the best value of one logged metric."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="sweeps")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="submitted_sweeps"
    )
    name = models.CharField(max_length=100)
    code = models.ForeignKey("bundles.CodeBundle", on_delete=models.PROTECT, related_name="sweeps")
    job_template = models.JSONField(
        help_text="The trials' job submission (program, GPUs, env...), checked again per trial."
    )
    search_space = models.JSONField(help_text="Hyperparameters: scheduler.asha's dimensions.")
    metric = models.CharField(max_length=64, help_text="The logged metric the sweep ranks by.")
    mode = models.CharField(max_length=3, help_text="'min' or 'max'.")
    strategy = models.CharField(max_length=8, help_text="'grid', 'random' or 'asha'.")
    eta = models.PositiveIntegerField(default=3)
    min_steps = models.PositiveIntegerField()
    max_steps = models.PositiveIntegerField()
    max_trials = models.PositiveIntegerField()
    max_gpu_hours = models.FloatField(null=True, blank=True)
    max_running = models.PositiveIntegerField(null=True, blank=True)
    seed = models.BigIntegerField(default=0)
    state = models.CharField(
        max_length=10, choices=SweepState.choices, default=SweepState.RUNNING, db_index=True
    )
    reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = SweepQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(eta__gte=2), name="sweep_eta_at_least_2"),
            models.CheckConstraint(
                condition=models.Q(min_steps__gte=1)
                & models.Q(min_steps__lte=models.F("max_steps")),
                name="sweep_steps_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"sweep {self.pk} ({self.name}, {self.strategy})"


class Trial(models.Model):
    """One point of a sweep's search space, and how far the strategy let it train: ``rung``
    is the rung its current job trains toward (or finished); ``results`` its metric at each
    rung it finished (``{"0": 0.41, ...}``)."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    index = models.PositiveIntegerField()
    params = models.JSONField()
    rung = models.PositiveIntegerField(default=0)
    results = models.JSONField(default=dict, blank=True)
    best_metric = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=10, default="running", db_index=True)
    reason = models.CharField(max_length=300, blank=True, default="")
    job = models.ForeignKey(
        "Job",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Its current job (the newest: each promotion starts a new one).",
    )

    class Meta:
        ordering = ["sweep_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "index"], name="one_trial_per_index")
        ]

    def __str__(self) -> str:
        return f"trial {self.index} of sweep {self.sweep_id} (rung {self.rung}, {self.status})"


class Job(models.Model):
    """A distributed training job with an elastic range of GPUs."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="submitted_jobs"
    )
    name = models.CharField(max_length=100)
    workload = models.CharField(
        max_length=64, blank=True, help_text="Built-in workload; empty for a program."
    )
    args = models.JSONField(default=dict, blank=True)
    code = models.ForeignKey(
        "bundles.CodeBundle",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="jobs",
        help_text="The program's code bundle; null for a built-in workload.",
    )
    entrypoint = models.CharField(
        max_length=2000, blank=True, default="", help_text="Python file of the bundle, arguments."
    )
    launcher = models.CharField(max_length=10, choices=Launcher.choices, default=Launcher.EDL)
    kind = models.CharField(
        max_length=8,
        choices=JobKind.choices,
        default=JobKind.BATCH,
        db_index=True,
        help_text="A batch job, or an interactive session (jobs.sessions).",
    )
    idle_timeout_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="A session is stopped after this many seconds without activity "
        "(null: a batch job).",
    )
    lab_access = models.CharField(
        max_length=8,
        choices=LabAccess.choices,
        default=LabAccess.CREATOR,
        help_text="Who may open a session's JupyterLab: its creator, or its tenant's members.",
    )
    last_activity_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A session's latest client request or kernel activity (null: none yet).",
    )
    env = models.JSONField(default=dict, blank=True, help_text="The program's own variables.")
    environment = models.JSONField(
        default=dict,
        blank=True,
        help_text="The program's own Python dependencies (workers.environment): requirements, "
        "python, replace; empty: the node's base layer.",
    )
    environment_used = models.JSONField(
        default=dict,
        blank=True,
        help_text="What its processes last started in (an agent's Started): environment key, "
        "packages installed with versions, cache hit, build seconds, node; empty: none yet.",
    )
    generation = models.PositiveIntegerField(
        default=0, help_text="Runs of a torchrun program: each start or restart is a new one."
    )
    finished_workers = models.JSONField(
        default=list, blank=True, help_text="Workers of this run that exited cleanly (torchrun)."
    )
    gpus = models.PositiveIntegerField(help_text="GPUs requested.")
    min_gpus = models.PositiveIntegerField()
    max_gpus = models.PositiveIntegerField()
    # What kind of GPUs and servers it needs (issue 38; ``jobs.resource_requests`` checks them).
    gpu_types = models.JSONField(
        default=list, blank=True, help_text="GPU type slugs it accepts, preferred first; [] = any."
    )
    node_selector = models.JSONField(
        default=dict, blank=True, help_text="Labels a server must carry (label -> value)."
    )
    cpus_per_gpu = models.PositiveIntegerField(
        default=0, help_text="CPU cores it needs per GPU (0: no request)."
    )
    mem_per_gpu_mib = models.PositiveIntegerField(
        default=0, help_text="Host memory it needs per GPU, in MiB (0: no request)."
    )
    ran_on_type = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="The GPU type of its latest start (usage and fair share count by type).",
    )
    batch_size = models.PositiveIntegerField(
        help_text="Global mini-batch size, fixed across scaling."
    )
    priority = models.IntegerField(default=50, help_text="0 (lowest) to 100 (highest).")
    recovery = models.CharField(
        max_length=12, choices=RecoveryMode.choices, default=RecoveryMode.CONSISTENT
    )
    checkpoint_interval = models.PositiveIntegerField(
        default=50, help_text="Mini-batches between checkpoints (consistent recovery)."
    )
    max_restarts = models.PositiveIntegerField(
        default=0, help_text="Times a failed program is requeued before the job fails."
    )
    restarts = models.PositiveIntegerField(
        default=0, help_text="Restarts used: requeues after the program failed."
    )
    max_runtime_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Seconds of wall clock since the first start before the job is stopped "
        "(null: no limit).",
    )
    state = models.CharField(
        max_length=10, choices=JobState.choices, default=JobState.PENDING, db_index=True
    )
    parallelism = models.PositiveIntegerField(default=0, help_text="GPUs held now.")
    submitted_at = models.DateTimeField(db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attained_gpu_seconds = models.FloatField(default=0.0)
    failure_reason = models.CharField(max_length=500, blank=True, default="")
    # Live progress, as the node agents report it.
    step = models.PositiveIntegerField(default=0)
    samples_per_s = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    log_tail = models.TextField(blank=True, default="")
    throughput_curve = models.JSONField(
        default=dict, blank=True, help_text="Profiled samples/s by GPU count (EDL profile())."
    )
    measured_curve = models.JSONField(
        default=dict, blank=True, help_text="Measured samples/s by GPU count (running average)."
    )
    allocation = models.JSONField(
        default=dict, blank=True, help_text="The vClos allocation (fabric.Allocation.to_dict())."
    )
    last_service_at = models.DateTimeField(null=True, blank=True)
    wait_reason = models.CharField(
        max_length=300, blank=True, default="", help_text="Why a queued job is not running."
    )
    profile_state = models.CharField(
        max_length=10, blank=True, default="", help_text="'', 'requested' or 'done'."
    )
    last_event_id = models.CharField(
        max_length=64, blank=True, default="", help_text="Newest runtime event applied."
    )
    recent_event_ids = models.JSONField(
        default=list,
        blank=True,
        help_text="Runtime events applied lately (agents on several nodes may deliver out of order).",
    )
    coordination_cleaned_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the job's coordination keys were removed from Redis (after it ended).",
    )
    estimated_start = models.DateTimeField(
        null=True, blank=True, help_text="Predicted start of a queued job (jobs.forecast)."
    )
    estimated_finish = models.DateTimeField(
        null=True, blank=True, help_text="Predicted finish of a queued or running job."
    )
    queue_position = models.PositiveIntegerField(
        null=True, blank=True, help_text="1-based place in the policy's queue order (queued jobs)."
    )
    estimate_reason = models.CharField(
        max_length=200, blank=True, default="", help_text="Why an estimate is missing."
    )
    estimated_at = models.DateTimeField(
        null=True, blank=True, help_text="When the forecast behind the estimates ran."
    )
    array = models.ForeignKey(
        JobArray,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="tasks",
        help_text="The array this job is a task of (null: a job of its own).",
    )
    array_index = models.PositiveIntegerField(
        null=True, blank=True, help_text="Its TASK_ID in the array (a retry keeps it)."
    )
    trial = models.ForeignKey(
        Trial,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="jobs",
        help_text="The sweep trial this job trains (null: none); a promotion makes a new job.",
    )
    sched_weight = models.FloatField(
        default=1.0,
        help_text="How strongly the job claims idle GPUs (a sweep sets eta**rung on its "
        "promoted trials; 1 for every other job).",
    )
    resumed_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="resumed_by",
        help_text="The job whose newest checkpoint was copied into this one's at submission.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    row_txid = models.BigIntegerField(
        default=0,
        editable=False,
        db_index=True,
        help_text=(
            "The transaction that last wrote this row (PostgreSQL: set by a trigger on every "
            "insert and update, whoever writes; 0 elsewhere): the tick's change feed."
        ),
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["tenant", "state"], name="job_tenant_state")]
        constraints = [
            models.CheckConstraint(condition=models.Q(min_gpus__gte=1), name="job_min_positive"),
            models.CheckConstraint(
                condition=models.Q(min_gpus__lte=models.F("gpus"))
                & models.Q(gpus__lte=models.F("max_gpus")),
                name="job_requested_within_range",
            ),
            models.CheckConstraint(
                condition=models.Q(priority__gte=0) & models.Q(priority__lte=100),
                name="job_priority_range",
            ),
            models.CheckConstraint(
                condition=models.Q(attained_gpu_seconds__gte=0), name="job_service_nonnegative"
            ),
            models.CheckConstraint(
                condition=models.Q(max_runtime_s__isnull=True) | models.Q(max_runtime_s__gte=1),
                name="job_runtime_limit_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(kind=JobKind.BATCH)
                | (
                    models.Q(min_gpus=models.F("gpus"))
                    & models.Q(max_gpus=models.F("gpus"))
                    & models.Q(idle_timeout_s__isnull=False)
                    & models.Q(idle_timeout_s__gte=1)
                ),
                name="job_session_fixed_size_with_idle_timeout",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.name})"

    @property
    def restarts_to_resize(self) -> bool:
        """Whether the job runs a torchrun program: resized by a restart, ended by its exits."""
        return self.code_id is not None and self.launcher == Launcher.TORCHRUN

    @property
    def runs(self) -> str:
        """What the job runs, in a few words: a built-in workload, or launcher and entrypoint."""
        if not self.code_id:
            return self.workload
        return f"{self.launcher}: {self.entrypoint}"

    @property
    def is_session(self) -> bool:
        """Whether the job is an interactive session (``jobs.sessions``)."""
        return self.kind == JobKind.SESSION

    @property
    def restarts_left(self) -> int:
        """How many more times a failed program will be requeued."""
        return max(self.max_restarts - self.restarts, 0)

    @property
    def runtime_deadline(self) -> datetime | None:
        """When the run-time limit stops the job (None: no limit, or not started yet)."""
        if self.max_runtime_s is None or self.started_at is None:
            return None
        return self.started_at + timedelta(seconds=self.max_runtime_s)

    @property
    def jct_seconds(self) -> float | None:
        """Job completion time (finished - submitted), once the job has finished."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.submitted_at).total_seconds()


class JobEvent(models.Model):
    """One change in a job's life, with the reason: the job's history is drawn from these."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=12, choices=EventKind.choices)
    from_state = models.CharField(max_length=10, blank=True, default="")
    to_state = models.CharField(max_length=10, blank=True, default="")
    from_parallelism = models.PositiveIntegerField(null=True, blank=True)
    to_parallelism = models.PositiveIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} of job {self.job_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class JobDependency(models.Model):
    """What a pending job waits for (``jobs.dependencies``): one job, or a whole array (met
    when every task meets it), to end in the way ``kind`` names."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    kind = models.CharField(max_length=12, choices=DependencyKind.choices)
    on_job = models.ForeignKey(
        Job, on_delete=models.CASCADE, null=True, blank=True, related_name="dependents"
    )
    on_array = models.ForeignKey(
        JobArray, on_delete=models.CASCADE, null=True, blank=True, related_name="dependents"
    )

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(on_job__isnull=False) & models.Q(on_array__isnull=True))
                | (models.Q(on_job__isnull=True) & models.Q(on_array__isnull=False)),
                name="dependency_on_one_thing",
            )
        ]

    def __str__(self) -> str:
        target = f"job {self.on_job_id}" if self.on_job_id else f"array {self.on_array_id}"
        return f"job {self.job_id} {self.kind} {target}"


class JobGpu(models.Model):
    """One GPU held by a running job, with its rank; a GPU can belong to one job only."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_slots")
    gpu = models.OneToOneField("inventory.Gpu", on_delete=models.PROTECT, related_name="assignment")
    rank = models.PositiveIntegerField()

    class Meta:
        ordering = ["job_id", "rank"]
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="one_gpu_per_rank")]

    def __str__(self) -> str:
        return f"job {self.job_id} rank {self.rank} on gpu {self.gpu_id}"

    @property
    def worker_id(self) -> str:
        """The elastic runtime's worker id for this slot (stable while the job holds it)."""
        return f"w{self.gpu.index}"


class JobCable(models.Model):
    """A leaf-spine cable reserved for one job alone (vClos); unique per (leaf, uplink port)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="cables")
    leaf = models.PositiveIntegerField()
    port = models.PositiveIntegerField(help_text="Uplink port of the leaf.")
    spine = models.PositiveIntegerField()

    class Meta:
        ordering = ["leaf", "port"]
        constraints = [models.UniqueConstraint(fields=["leaf", "port"], name="one_job_per_cable")]

    def __str__(self) -> str:
        return f"cable leaf {self.leaf} port {self.port} -> spine {self.spine} (job {self.job_id})"


class JobMetric(models.Model):
    """One progress sample of a running job: the time series behind its charts."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    at = models.DateTimeField()
    step = models.PositiveIntegerField()
    parallelism = models.PositiveIntegerField()
    samples_per_s = models.FloatField()
    loss = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="metric_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}: {self.samples_per_s:.1f} samples/s"


class LogStream(models.Model):
    """One log file of one worker of a job, as far as the control plane holds it.

    ``end`` is the byte offset up to which the file has arrived and ``gaps``
    the ranges below it still missing (reports can arrive out of order): a
    replayed or overlapping report is cut against them.  ``stored_bytes`` is
    how many of its bytes are still kept (``LOG_MAX_BYTES`` drops the oldest).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_streams")
    node = models.CharField(max_length=128)
    log_id = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=128)
    end = models.BigIntegerField(default=0)
    gaps = models.JSONField(
        default=list, blank=True, help_text="[start, stop) byte ranges below end not yet seen."
    )
    stored_bytes = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "node", "log_id"], name="one_log_stream")
        ]

    def __str__(self) -> str:
        return f"log {self.log_id} of job {self.job_id} ({self.end} bytes)"


class LogChunk(models.Model):
    """A piece of a job's output: bytes ``[offset, offset + size)`` of one log file.

    Read in ``id`` order, the chunks are the job's whole log.  A marker chunk
    (empty ``log_id``) stands where older chunks were dropped for
    ``LOG_MAX_BYTES``; its ``offset`` counts the bytes dropped.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    node = models.CharField(max_length=128)
    worker_id = models.CharField(max_length=128)
    log_id = models.CharField(max_length=200)
    offset = models.BigIntegerField()
    rank = models.PositiveIntegerField(null=True, blank=True)
    generation = models.PositiveIntegerField(null=True, blank=True)
    text = models.TextField()
    size = models.PositiveIntegerField(help_text="Bytes of the log file that text covers.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"], name="logchunk_job_id")]

    def __str__(self) -> str:
        return f"log of job {self.job_id}: {self.worker_id} @{self.offset}+{self.size}"

    @property
    def is_marker(self) -> bool:
        """Whether this chunk stands for dropped older output."""
        return not self.log_id


class Artifact(models.Model):
    """One object a job stored in the artifact store: a checkpoint, a file it saved, its log.

    ``path`` is the object's full path in the store (the job's prefix, then
    the job-relative path a report named); it is built from the database, never
    taken from a report, so a row can only point inside its own job's prefix.
    The row is what a download serves and what retention deletes.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=10, choices=ArtifactKind.choices)
    path = models.CharField(max_length=1000, help_text="Path in the store, job prefix included.")
    name = models.CharField(max_length=255, blank=True, default="")
    step = models.PositiveBigIntegerField(null=True, blank=True)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "path"], name="one_artifact_per_path")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.path} ({self.size} bytes)"

    @property
    def job_path(self) -> str:
        """The path relative to the job's prefix (``checkpoints/step-000000050.pt``)."""
        # tenants/<slug>/jobs/<pk>/<job path>: a slug never holds a '/'.
        return self.path.split("/", 4)[-1]

    @property
    def filename(self) -> str:
        """The name a download is saved under: the last part of the path."""
        return self.path.rsplit("/", 1)[-1]


class TrainingMetric(models.Model):
    """One value a program logged at one step (``ctx.log_metrics(step, name=value)``).

    Kept apart from :class:`JobMetric` (the control plane's progress samples):
    these are whatever the program chose to log, capped per job at
    ``METRICS_MAX_POINTS``.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="training_metrics")
    step = models.PositiveBigIntegerField()
    name = models.CharField(max_length=64)
    value = models.FloatField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "name", "step", "id"]
        indexes = [models.Index(fields=["job", "name", "step"], name="trainmetric_job_name_step")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}: {self.name}={self.value:g}"


class NodeEnvironmentCache(models.Model):
    """The latest report of one node's environment cache (``environment_cache``): its size,
    cap and how many environments the report left out; the entries are ``CachedEnvironment``.

    Replaced whole by each newer report (``jobs.environment_caches``).
    """

    server = models.OneToOneField(
        "inventory.Server", on_delete=models.CASCADE, related_name="environment_cache"
    )
    reported_at = models.DateTimeField()
    max_bytes = models.PositiveBigIntegerField()
    total_bytes = models.PositiveBigIntegerField()
    omitted = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"environment cache of {self.server_id}"


class CachedEnvironment(models.Model):
    """One environment a node's cache held at its latest report: what was asked (its
    requirements), what it installed (pinned packages), its size, last use, and whether a
    worker on the node ran in it."""

    cache = models.ForeignKey(
        NodeEnvironmentCache, on_delete=models.CASCADE, related_name="entries"
    )
    key = models.CharField(max_length=32)
    size_bytes = models.PositiveBigIntegerField()
    last_used_at = models.DateTimeField()
    in_use = models.BooleanField(default=False)
    packages = models.JSONField(default=list)
    requirements = models.JSONField(default=list)
    packages_omitted = models.PositiveIntegerField(default=0)
    built_at = models.DateTimeField(null=True, blank=True)
    build_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["cache_id", "-last_used_at", "key"]
        constraints = [
            models.UniqueConstraint(fields=["cache", "key"], name="one_cached_environment_per_key")
        ]

    def __str__(self) -> str:
        return f"environment {self.key}"


class EvictionOutcome(models.TextChoices):
    """Where an admin's eviction stands: sent, or what the node's agent answered."""

    PENDING = "pending", "Sent"
    EVICTED = "evicted", "Evicted"
    IN_USE = "in_use", "Refused: in use"
    NOT_FOUND = "not_found", "Not found"
    FAILED = "failed", "Failed"


class EnvironmentEviction(models.Model):
    """An admin's request that a node evict one environment, and its agent's answer.

    ``command_id`` is the ``evict_environment`` command's: only the node it
    was sent to can answer it, once.
    """

    server = models.ForeignKey(
        "inventory.Server", on_delete=models.CASCADE, related_name="environment_evictions"
    )
    key = models.CharField(max_length=32)
    command_id = models.CharField(max_length=64, unique=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    requested_at = models.DateTimeField()
    outcome = models.CharField(
        max_length=16, choices=EvictionOutcome.choices, default=EvictionOutcome.PENDING
    )
    detail = models.CharField(max_length=300, blank=True, default="")
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self) -> str:
        return f"eviction of {self.key} ({self.outcome})"
