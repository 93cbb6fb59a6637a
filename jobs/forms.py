"""The job submission form; its rules are the service's (``check_job_spec``).

A job runs a built-in workload or a program: an archive uploaded with the
form (stored as a bundle by ``bundles.services.do_upload`` first) or one of
the tenant's earlier bundles, with an entrypoint, a launcher, variables and
requirements (requirements.txt lines, read by ``workers.environment.requirements_txt``).

Two optional parts make it a workflow (``docs/workflows.md``): **Run after**,
one dependency a line (``after_ok job 12``), handed to the service as the API's
``after`` list (``jobs.dependencies.check_after`` judges it, with the API's
words); and **Array: tasks** (with **at most running**), which submits an
array through ``jobs.arrays.check_array_spec`` instead of one job.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.db.models import QuerySet

from bundles.errors import BundleRefusedError
from bundles.models import CodeBundle
from bundles.services import do_upload
from inventory.services import current_spec
from jobs.arrays import ArraySpec, check_array_spec
from jobs.choices import Launcher, RecoveryMode
from jobs.program_spec import PROGRAM_FIELDS
from jobs.services import (
    MAX_GPUS_PER_JOB,
    JobSpec,
    JobValidationError,
    check_job_spec,
    placement_problem,
)
from scheduler.gpu_types import parse_selector
from tenancy.models import Tenant
from workers.catalog import WORKLOADS
from workers.environment import requirements_txt
from workers.program import ProgramError

BUILT_IN, PROGRAM = "builtin", "program"
PROGRAM_ONLY = ("archive", *PROGRAM_FIELDS)
GPU_FIELDS = ("gpus", "min_gpus", "max_gpus")
WORKFLOW_FIELDS = ("after", "array_size", "array_max_running")
"""The form's own fields for a workflow: read here, handed to the services by their API names."""
ARRAY_FIELD_OF = {"size": "array_size", "max_running": "array_max_running"}
"""The form's field for each of ``check_array_spec``'s own fields."""
AFTER_FIELD = re.compile(r"^after\[(\d+)\]")
NEAREST_SEARCH = 64
"""How far from a refused size the form looks for sizes that work (one query each)."""


def workload_guide() -> dict[str, dict[str, Any]]:
    """Each built-in workload's arguments (default, range, meaning) and its default batch.

    The submit form shows the chosen workload's list next to the arguments box.
    """
    return {
        name: {
            "description": spec.description,
            "default_batch_size": spec.default_batch_size,
            "args": [
                {
                    "name": arg,
                    "kind": "whole number" if a.kind is int else "number",
                    "default": a.default,
                    "minimum": a.minimum,
                    "maximum": a.maximum,
                    "help": a.help,
                }
                for arg, a in spec.args.items()
            ],
        }
        for name, spec in sorted(WORKLOADS.items())
    }


def nearest_placeable(gpus: int, most: int) -> tuple[int | None, int | None]:
    """The nearest job sizes below and above ``gpus`` (up to ``most``) that the fabric can isolate."""
    low, high = max(gpus - NEAREST_SEARCH, 0), min(gpus + NEAREST_SEARCH, most)
    below = next((n for n in range(gpus - 1, low, -1) if placement_problem(n) is None), None)
    above = next((n for n in range(gpus + 1, high + 1) if placement_problem(n) is None), None)
    return below, above


def fabric_words(gpus: int, most: int) -> str:
    """Why ``gpus`` GPUs cannot run here, in plain words, with the nearest sizes that can."""
    below, above = nearest_placeable(gpus, most)
    sizes = " or ".join(str(n) for n in (below, above) if n is not None)
    spec = current_spec()
    shape = (
        f" ({spec.leaves} leaf switch{'es' if spec.leaves != 1 else ''} of "
        f"{spec.gpus_per_leaf} GPUs)"
        if spec is not None
        else ""
    )
    why = (
        f"{gpus} GPUs cannot be given switches of their own on this cluster{shape}: a job "
        "larger than one leaf switch must split into equal parts over whole leaves."
    )
    return f"{why} The nearest sizes that can: {sizes}." if sizes else why


def after_entries(text: str) -> tuple[list[Any], list[int]]:
    """The Run-after box as the API's ``after`` list, and each entry's line number.

    One dependency a line: ``<kind> job <id>``, ``<kind> array <id>``, or
    ``<kind> <id>`` for a job.  Only the shape is read here; the kinds, ids and
    what they name are the service's to judge.  ``ValueError`` names a line of
    another shape.
    """
    entries: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        if len(words) == 2:
            words.insert(1, "job")
        if len(words) != 3:
            raise ValueError(
                f"Line {number}: write a kind, then job or array, then its id "
                "(after_ok job 12, after_any array 3)."
            )
        kind, target, ident = words
        entries.append({"kind": kind, target: int(ident) if ident.isdigit() else ident})
        lines.append(number)
    return entries, lines


class JobForm(forms.Form):
    """Submit a training job to one of the user's tenants.

    Errors come from the service (``check_job_spec``) and are reworded here with
    the labels the user sees; the limits named are the tenant's, not the API's.
    """

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), to_field_name="slug")
    name = forms.CharField(max_length=100)
    source = forms.ChoiceField(
        label="What to run",
        choices=[(BUILT_IN, "A built-in example workload"), (PROGRAM, "My own program")],
        initial=BUILT_IN,
        required=False,  # a built-in workload unless said otherwise
        widget=forms.RadioSelect,
    )
    workload = forms.ChoiceField(
        required=False,
        # Names only, so no option is cut off; the description shows with the arguments.
        choices=[(name, name) for name in sorted(WORKLOADS)],
    )
    args = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Arguments",
        help_text='A JSON object, e.g. {"epochs": 5}; arguments left out take their defaults '
        "(listed below for the chosen workload).",
    )
    archive = forms.FileField(
        required=False,
        label="Upload code",
        help_text=".tar.gz, .tgz or .zip of your program's directory.",
    )
    code = forms.ChoiceField(
        required=False, label="…or an earlier bundle", help_text="Bundles of your tenants."
    )
    entrypoint = forms.CharField(
        required=False,
        max_length=2000,
        help_text="A Python file of the bundle and its arguments, e.g. train.py --epochs 3 "
        "(never run through a shell).",
    )
    launcher = forms.ChoiceField(
        required=False,
        # A session is started on the sessions page (an idle timeout, a fixed size).
        choices=[(v, v) for v in Launcher.values if v != Launcher.SESSION],
        initial=Launcher.TORCHRUN,
        help_text="torchrun: an unmodified DDP program (a resize restarts it from its "
        "CHECKPOINT_DIR). edl: a program on the elastic SDK (resized without stopping).",
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="NAME=value, one per line.",
    )
    environment = forms.CharField(
        required=False,
        label="Requirements",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Python packages your program needs beyond the node's torch and edl, one per "
        "line as in requirements.txt, e.g. einops==0.8.1 (the bundle's own requirements.txt "
        "comes first). Packages come from the cluster's index: no options, paths or URLs.",
    )
    gpus = forms.IntegerField(
        min_value=1,
        initial=2,
        label="GPUs requested",
        help_text="What the job starts on when GPUs are free.",
    )
    min_gpus = forms.IntegerField(
        min_value=1,
        required=False,
        label="Min GPUs",
        help_text="The fewest it keeps: the scheduler may shrink it to this when others wait. "
        "Empty: GPUs requested.",
    )
    max_gpus = forms.IntegerField(
        min_value=1,
        required=False,
        label="Max GPUs",
        help_text="The most it grows to onto idle GPUs. Empty: GPUs requested "
        "(Min = Max: a fixed size).",
    )
    batch_size = forms.IntegerField(
        min_value=1,
        required=False,
        label="Global batch size",
        help_text="Samples per step over all GPUs, kept when the job is resized. "
        "Empty: the workload's default.",
    )
    priority = forms.IntegerField(min_value=0, max_value=100, initial=50)
    # Short option labels (a select cuts long ones off); what they mean is in the help.
    recovery = forms.ChoiceField(
        choices=[
            (RecoveryMode.CONSISTENT, "Consistent"),
            (RecoveryMode.APPROXIMATE, "Approximate"),
        ],
        initial=RecoveryMode.CONSISTENT,
        help_text="When a worker is lost. Consistent: restore the latest checkpoint. "
        "Approximate: the survivors redo the current mini-batch.",
    )
    checkpoint_interval = forms.IntegerField(
        min_value=1, initial=50, label="Checkpoint every (mini-batches)"
    )
    max_restarts = forms.IntegerField(
        min_value=0,
        required=False,
        label="Restarts",
        help_text="Times a failed program is requeued from its latest checkpoint. "
        "Empty: your tenant's default.",
    )
    max_runtime_s = forms.IntegerField(
        min_value=1,
        required=False,
        label="Run-time limit (s)",
        help_text="Wall clock since the first start; then the job stops with a final checkpoint "
        "and fails. Empty: your tenant's default.",
    )
    gpu_types = forms.CharField(
        required=False,
        label="GPU types",
        help_text="The GPU types it accepts, preferred first, comma-separated "
        "(e.g. h100-80g, a100-40g). Empty: any type. Its GPUs are all of one type.",
    )
    node_selector = forms.CharField(
        required=False,
        label="Servers labelled",
        help_text="Labels its servers must carry, e.g. pool=train, rack=r12. Empty: any server.",
    )
    cpus_per_gpu = forms.IntegerField(
        min_value=0,
        required=False,
        label="CPU cores per GPU",
        help_text="Empty: your tenant's default.",
    )
    mem_per_gpu_mib = forms.IntegerField(
        min_value=0,
        required=False,
        label="Host memory per GPU (MiB)",
        help_text="Empty: your tenant's default.",
    )

    after = forms.CharField(
        required=False,
        label="Run after",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Jobs or arrays of the same tenant to wait for, one a line: after_ok job 12 "
        "(once it completed), after_any array 3 (once every task ended), after_failed job 7 "
        "(only if it failed). Until then the job stays pending.",
    )
    array_size = forms.IntegerField(
        required=False,
        label="Array: tasks",
        help_text="Submit an array of this many tasks of your program instead of one job; "
        "each task gets TASK_ID (0, 1, ...) and TASK_COUNT in its environment. Empty: one job.",
    )
    array_max_running = forms.IntegerField(
        required=False,
        label="Array: at most running",
        help_text="How many tasks may be queued or running at once; the rest wait pending. "
        "Empty: no cap.",
    )

    def __init__(self, *args: Any, tenants: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        if tenants.count() == 1:
            self.fields["tenant"].initial = tenants.first()
        bundles = CodeBundle.objects.filter(tenant__in=tenants).select_related("tenant")[:200]
        self.fields["code"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (b.sha256, f"{b.tenant.slug}: {b.sha256[:12]} — {b.file_count} files, "
             f"{b.created_at:%Y-%m-%d %H:%M}")
            for b in bundles
        ]  # fmt: skip
        self.spec: JobSpec | None = None
        self.array_spec: ArraySpec | None = None
        """Set instead of ``spec`` when the form submits an array."""
        self._after_lines: list[int] = []
        self.workload_guide = workload_guide()
        self._explain_limits(tenants)

    def _explain_limits(self, tenants: QuerySet[Tenant]) -> None:
        """Say the real GPU limit (the tenant's quota) and the default batch next to the fields."""
        quotas = ", ".join(f"{t.slug}: {t.gpu_quota}" for t in tenants[:20])
        single = tenants.first() if tenants.count() == 1 else None
        limit = (
            f"At most {single.gpu_quota}, the GPU quota of tenant {single.slug}."
            if single is not None
            else f"At most your tenant's GPU quota ({quotas})."
        )
        self.fields["gpus"].help_text = f"{self.fields['gpus'].help_text} {limit}"
        self.fields["gpus"].widget.attrs["max"] = str(
            single.gpu_quota if single is not None else MAX_GPUS_PER_JOB
        )
        default = WORKLOADS[min(WORKLOADS)].default_batch_size
        self.fields["batch_size"].widget.attrs["placeholder"] = str(default)

    def in_users_words(
        self, field: str | None, message: str, tenant: Tenant, cleaned: dict[str, Any]
    ) -> str:
        """A service error reworded with the form's labels and the tenant's real limits.

        ``cleaned`` is the form's data as submitted (``add_error`` drops a field from
        ``cleaned_data``, so a second error of one field would no longer see its value).
        """
        size = cleaned.get(field) if field in GPU_FIELDS else None
        if isinstance(size, int) and size > 0 and message == placement_problem(size):
            return fabric_words(size, tenant.gpu_quota)
        if message == f"Must be between 1 and {MAX_GPUS_PER_JOB}." and field in GPU_FIELDS:
            return (
                f"Must be between 1 and {tenant.gpu_quota}, the GPU quota of tenant {tenant.slug}."
            )
        if field == "gpus" and message.startswith("Requests ") and "has a quota of" in message:
            return (
                f"GPUs requested cannot exceed {tenant.gpu_quota}, the GPU quota of tenant "
                f"{tenant.slug}."
            )
        if field == "gpus" and message.startswith("Requested GPUs must lie between"):
            low, high = cleaned.get("min_gpus"), cleaned.get("max_gpus")
            return f"GPUs requested must lie between Min GPUs ({low}) and Max GPUs ({high})."
        labels = {name: str(self.fields[name].label) for name in (*GPU_FIELDS, "batch_size")}
        return re.sub(r"\b(" + "|".join(labels) + r")\b", lambda m: labels[m.group(1)], message)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        tenant = cleaned.get("tenant")
        if tenant is None or self.errors:
            return cleaned
        data = {k: v for k, v in cleaned.items() if k != "tenant" and v not in (None, "")}
        data.pop("source", None)
        for name in WORKFLOW_FIELDS:
            data.pop(name, None)
        if not self._take_after(cleaned.get("after") or "", data):
            return cleaned
        if not self._take_selector(data):
            return cleaned
        if cleaned.get("source") == PROGRAM:
            data.pop("workload", None)
            data.pop("args", None)
            if not self._take_requirements(data) or not self._take_archive(tenant, data):
                return cleaned
            data.setdefault("code", "")  # the service says a bundle is needed
        else:
            for name in PROGRAM_ONLY:
                data.pop(name, None)
        try:
            self._check(tenant, data, cleaned)
        except JobValidationError as exc:
            submitted = dict(cleaned)
            for field, messages in exc.errors.items():
                target, line = self._form_field(field)
                for message in messages:
                    words = self.in_users_words(target, message, tenant, submitted)
                    self.add_error(target, f"{line}{words}")
        return cleaned

    def _check(self, tenant: Tenant, data: dict[str, Any], cleaned: dict[str, Any]) -> None:
        """Check a job (``spec``), or an array (``array_spec``) when a number of tasks is given."""
        size, cap = cleaned.get("array_size"), cleaned.get("array_max_running")
        if size is None and cap is None:
            self.spec = check_job_spec(tenant=tenant, data=data)
            return
        if size is None:
            self.add_error("array_size", "Give the number of tasks to submit an array.")
            return
        self.array_spec = check_array_spec(
            tenant=tenant, data={**data, "size": size, "max_running": cap}
        )

    def _form_field(self, field: str) -> tuple[str | None, str]:
        """The form's field for a service's error field, and the Run-after line it is about.

        ``environment.requirements`` is the Requirements box; ``after[2].job`` the
        Run-after box, on the line of its third entry; ``size`` the Array: tasks box.
        """
        entry = AFTER_FIELD.match(field)
        if entry is not None:
            index = int(entry.group(1))
            number = self._after_lines[index] if index < len(self._after_lines) else index + 1
            return "after", f"Line {number}: "
        name = ARRAY_FIELD_OF.get(field, field.partition(".")[0])
        return (name if name in self.fields else None), ""

    def _take_after(self, text: str, data: dict[str, Any]) -> bool:
        """The Run-after box as the service's ``after``; False (the error shown) if unreadable."""
        try:
            entries, self._after_lines = after_entries(text)
        except ValueError as exc:
            self.add_error("after", str(exc))
            return False
        if entries:
            data["after"] = entries
        return True

    def _take_selector(self, data: dict[str, Any]) -> bool:
        """The labels box (``pool=train, rack=r12``) as the service's ``node_selector``;
        False (the error shown) if unreadable."""
        text = data.get("node_selector")
        if not isinstance(text, str):
            return True
        try:
            data["node_selector"] = dict(parse_selector(text))
        except ValueError as exc:
            self.add_error("node_selector", str(exc))
            return False
        return True

    def _take_requirements(self, data: dict[str, Any]) -> bool:
        """The Requirements box as the ``environment`` the service checks; False if refused."""
        text = data.pop("environment", "")
        if not text.strip():
            return True
        try:
            data["environment"] = {"requirements": list(requirements_txt(text, "environment"))}
        except ProgramError as exc:
            self.add_error("environment", exc.message[:1].upper() + exc.message[1:] + ".")
            return False
        return True

    def _take_archive(self, tenant: Tenant, data: dict[str, Any]) -> bool:
        """Store an uploaded archive as a bundle and use it; False if it was refused."""
        archive = data.pop("archive", None)
        if archive is None:
            return True
        try:
            bundle, _created = do_upload(user=self.user, tenant=tenant, uploaded_file=archive)
        except BundleRefusedError as exc:
            self.add_error("archive" if exc.field == "archive" else None, exc.message)
            return False
        data["code"] = bundle.sha256
        return True
