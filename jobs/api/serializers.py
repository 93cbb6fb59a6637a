"""Serializers of the jobs API: the Job as clients see it, and the request shapes."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from bundles.models import CodeBundle
from jobs.choices import Launcher, RecoveryMode
from jobs.dependencies import MAX_DEPENDENCIES
from jobs.models import Artifact, Job, JobArray, JobEvent
from jobs.services import JOB_FIELDS, MAX_GPUS_PER_JOB, MAX_RESTARTS, MAX_RUNTIME_S
from tenancy.models import Tenant
from workers.catalog import WORKLOADS


class StrictCharField(serializers.CharField):
    """A text field that takes JSON strings only: DRF's own turns ``123`` into ``"123"``."""

    def to_internal_value(self, data: Any) -> str:
        """The string, or the field's "invalid" error for any other JSON type."""
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class JobSerializer(serializers.ModelSerializer[Job]):
    """A job, as the API returns it."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    jct_seconds = serializers.FloatField(read_only=True, allow_null=True)
    runtime_deadline = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When the run-time limit stops the job."
    )
    code: serializers.SlugRelatedField[CodeBundle] = serializers.SlugRelatedField(
        slug_field="sha256", read_only=True, allow_null=True
    )
    after = serializers.SerializerMethodField(
        help_text='What the job waits for: [{"kind": "after_ok", "job": 12}, {"kind": '
        '"after_any", "array": 3}]; while they are not met it stays pending (wait_reason).'
    )

    class Meta:
        model = Job
        fields = [
            "id",
            *JOB_FIELDS,  # what a client submits, then what the system adds
            "after",
            "array",
            "array_index",
            "trial",
            "resumed_from",
            "sched_weight",
            "kind",
            "idle_timeout_s",
            "lab_access",
            "last_activity_at",
            "state",
            "parallelism",
            "submitted_at",
            "started_at",
            "finished_at",
            "attained_gpu_seconds",
            "jct_seconds",
            "failure_reason",
            "wait_reason",
            "queue_position",
            "estimated_start",
            "estimated_finish",
            "estimate_reason",
            "estimated_at",
            "step",
            "samples_per_s",
            "loss",
            "throughput_curve",
            "environment_used",
            "generation",
            "restarts",
            "runtime_deadline",
            "tenant",
        ]
        read_only_fields = fields

    @extend_schema_field(
        serializers.ListField(child=serializers.DictField(child=serializers.JSONField()))
    )
    def get_after(self, job: Job) -> list[dict[str, Any]]:
        """The job's dependencies (prefetched by the list: ``dependencies``)."""
        return [
            {"kind": d.kind, "job": d.on_job_id}
            if d.on_job_id is not None
            else {"kind": d.kind, "array": d.on_array_id}
            for d in job.dependencies.all()
        ]


AFTER_HELP = (
    'Jobs or arrays of the same tenant to wait for: [{"kind": "after_ok", "job": 12}, '
    '{"kind": "after_any", "array": 3}]. Kinds: after_ok (it completed), after_any (it ended), '
    "after_failed (it failed); an array's is met when every task's is. The job stays pending, "
    "with wait_reason, until all are met, and is cancelled with the reason when one can no "
    f"longer be. At most {MAX_DEPENDENCIES}."
)


class JobCreateSerializer(serializers.Serializer[Job]):
    """What a client sends to submit a job (documents the schema; rules live in the service)."""

    name = serializers.CharField(max_length=100)
    workload = serializers.ChoiceField(
        choices=sorted(WORKLOADS), required=False, help_text="A built-in workload, or give code."
    )
    args = serializers.DictField(required=False, help_text="Workload arguments.")
    code = serializers.CharField(
        required=False, help_text="A code bundle id (sha256, from POST /api/v1/code/)."
    )
    entrypoint = serializers.CharField(
        required=False,
        help_text="With code: a Python file of the bundle and its arguments, e.g. "
        "'train.py --epochs 3' (split with shell rules, never run through a shell).",
    )
    launcher = serializers.ChoiceField(
        choices=Launcher.choices,
        required=False,
        help_text="With code: 'edl' (elastic SDK, resized without stopping) or 'torchrun' "
        "(unmodified DDP; a resize restarts it from its CHECKPOINT_DIR).",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text="With code: the program's own variables (NAME: value; at most 64, 4 KiB).",
    )
    environment = serializers.JSONField(
        required=False,
        help_text="With code: the program's own Python dependencies, installed over the node's "
        'base layer (torch, edl): {"requirements": ["einops==0.8.1"], "python": "3.11", '
        '"replace": []}. Requirements name packages of the operator\'s index only (PEP 508; '
        "no options, paths or URLs); the bundle's uv.lock, requirements.txt or pyproject.toml "
        'comes first. "indexes": at most 3 extra https:// index URLs, without credentials, '
        "where the operator sets ENVIRONMENT_ALLOW_JOB_INDEX (a 400 otherwise).",
    )
    gpus = serializers.IntegerField(min_value=1)
    min_gpus = serializers.IntegerField(min_value=1, required=False)
    max_gpus = serializers.IntegerField(min_value=1, required=False)
    batch_size = serializers.IntegerField(min_value=1, required=False)
    priority = serializers.IntegerField(min_value=0, max_value=100, required=False)
    recovery = serializers.ChoiceField(choices=RecoveryMode.choices, required=False)
    checkpoint_interval = serializers.IntegerField(min_value=1, required=False)
    max_restarts = serializers.IntegerField(
        min_value=0,
        max_value=MAX_RESTARTS,
        required=False,
        help_text="Times a failed program is requeued (from its latest checkpoint) before the "
        "job fails; default: the tenant's, at most its ceiling.",
    )
    max_runtime_s = serializers.IntegerField(
        min_value=1,
        max_value=MAX_RUNTIME_S,
        required=False,
        allow_null=True,
        help_text="Seconds of wall clock since the first start; then the job is stopped with a "
        "final checkpoint and fails. Default: the tenant's, at most its ceiling.",
    )
    gpu_types = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text='GPU type slugs the job accepts, preferred first (e.g. ["h100-80g"]); '
        "empty: any. Its GPUs are all of one type.",
    )
    node_selector = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text='Labels a server must carry to hold it, e.g. {"pool": "train"}.',
    )
    cpus_per_gpu = serializers.IntegerField(
        min_value=0, required=False, help_text="CPU cores per GPU; default: the tenant's."
    )
    mem_per_gpu_mib = serializers.IntegerField(
        min_value=0, required=False, help_text="Host memory per GPU in MiB; default: the tenant's."
    )
    after = serializers.ListField(
        child=serializers.DictField(child=serializers.JSONField()),
        required=False,
        help_text=AFTER_HELP,
    )
    resume_from = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="A job of the same tenant: its newest complete, verified checkpoint is copied "
        "into this job's store before it is queued, and the job starts from it.",
    )
    tenant = serializers.SlugField(
        required=False, help_text="Tenant slug; required only if you belong to several."
    )


class JobTenantSerializer(serializers.Serializer[Any]):
    """The ``tenant`` of a submission, checked before it reaches a query."""

    tenant = serializers.SlugField(required=False)


class JobUpdateSerializer(serializers.Serializer[Job]):
    """What a client may change on a live job."""

    priority = serializers.IntegerField(min_value=0, max_value=100, required=False)
    min_gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_JOB, required=False)
    max_gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_JOB, required=False)
    max_restarts = serializers.IntegerField(min_value=0, max_value=MAX_RESTARTS, required=False)
    max_runtime_s = serializers.IntegerField(min_value=1, max_value=MAX_RUNTIME_S, required=False)
    after = serializers.ListField(
        child=serializers.DictField(child=serializers.JSONField()),
        required=False,
        help_text="A waiting (pending) job's new dependencies, replacing its old ones; "
        "one that would close a cycle is refused. " + AFTER_HELP,
    )


CANCEL_REASON_MAX = 200


class JobCancelSerializer(serializers.Serializer[Job]):
    """Optional reason for a cancellation: a string of at most 200 characters."""

    reason = StrictCharField(max_length=CANCEL_REASON_MAX, required=False, allow_blank=True)


class JobEventSerializer(serializers.ModelSerializer[JobEvent]):
    """One entry of a job's history."""

    class Meta:
        model = JobEvent
        fields = [
            "id",
            "at",
            "kind",
            "from_state",
            "to_state",
            "from_parallelism",
            "to_parallelism",
            "reason",
            "data",
        ]
        read_only_fields = fields


class LogLineSerializer(serializers.Serializer[Any]):
    """One line of a job's output (the schema of ``GET /jobs/{id}/logs/``)."""

    cursor = serializers.CharField(help_text="Opaque; pass it as since= to read what follows.")
    worker = serializers.CharField(help_text="Worker id; empty on a dropped-output marker.")
    rank = serializers.IntegerField(allow_null=True)
    generation = serializers.IntegerField(allow_null=True)
    node = serializers.CharField()
    text = serializers.CharField(help_text="The line as text (never HTML), without its newline.")


class JobLogSerializer(serializers.Serializer[Any]):
    """A page of a job's output."""

    lines = LogLineSerializer(many=True)
    cursor = serializers.CharField(help_text="The last line's cursor (or since's when none).")
    done = serializers.BooleanField(help_text="The job is over and every line was read.")


class ArtifactSerializer(serializers.ModelSerializer[Artifact]):
    """An object a job stored: a checkpoint, a file it saved, its log."""

    path = serializers.CharField(
        source="job_path", read_only=True, help_text="Relative to the job's store prefix."
    )
    download_url = serializers.SerializerMethodField(
        help_text="GET it for the bytes (Range, If-None-Match supported)."
    )

    class Meta:
        model = Artifact
        fields = [
            "id",
            "kind",
            "name",
            "path",
            "step",
            "size",
            "sha256",
            "created_at",
            "download_url",
        ]
        read_only_fields = fields

    def get_download_url(self, artifact: Artifact) -> str:
        """The artifact's download endpoint (absolute when the request is known)."""
        url = f"/api/v1/jobs/{artifact.job_id}/artifacts/{artifact.pk}/download/"
        request = self.context.get("request")
        return request.build_absolute_uri(url) if request is not None else url


class ProgressPointSerializer(serializers.Serializer[Any]):
    """One progress sample of a running job."""

    step = serializers.IntegerField()
    at = serializers.DateTimeField()
    samples_per_s = serializers.FloatField()
    parallelism = serializers.IntegerField()
    loss = serializers.FloatField(allow_null=True)


class JobMetricsSerializer(serializers.Serializer[Any]):
    """A job's progress samples and the metrics its program logged (the schema of /metrics/)."""

    progress = ProgressPointSerializer(many=True)
    metrics = serializers.DictField(
        child=serializers.ListField(child=serializers.ListField(child=serializers.FloatField())),
        help_text="Metric name: [[step, value], ...] in step order.",
    )


class ArrayCreateSerializer(JobCreateSerializer):
    """What a client sends to submit an array: a job's fields (a program: code, entrypoint,
    launcher) plus how many tasks and how many at once (documents the schema; rules live in
    ``jobs.arrays``)."""

    size = serializers.IntegerField(
        min_value=1, help_text="Tasks; each gets TASK_ID (0 to size-1) and TASK_COUNT in env."
    )
    max_running = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="Tasks queued or running at once; the rest wait pending (default: no cap).",
    )


class ArrayTaskSerializer(serializers.Serializer[Any]):
    """One task of an array (its latest attempt)."""

    task_id = serializers.IntegerField()
    job = serializers.IntegerField()
    state = serializers.CharField()
    wait_reason = serializers.CharField()


class ArraySerializer(serializers.ModelSerializer[JobArray]):
    """An array as the API returns it, with how many tasks are in each state."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    counts = serializers.SerializerMethodField(
        help_text='Tasks (latest attempts) per state: {"running": 2, "pending": 4}.'
    )

    class Meta:
        model = JobArray
        fields = ["id", "tenant", "name", "size", "max_running", "created_at", "counts"]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_counts(self, array: JobArray) -> dict[str, int]:
        """From the view's context (one query for a whole page)."""
        counts: dict[int, dict[str, int]] = self.context.get("counts", {})
        return counts.get(array.pk, {})


class ArrayDetailSerializer(ArraySerializer):
    """One array, with its tasks."""

    tasks = serializers.SerializerMethodField()

    class Meta(ArraySerializer.Meta):
        fields = [*ArraySerializer.Meta.fields, "tasks"]
        read_only_fields = fields

    @extend_schema_field(ArrayTaskSerializer(many=True))
    def get_tasks(self, array: JobArray) -> list[dict[str, Any]]:
        """From the view's context: each TASK_ID's latest attempt."""
        tasks: list[dict[str, Any]] = self.context.get("tasks", [])
        return tasks
