"""The job submission form; its rules are the service's (``check_job_spec``).

A job runs a built-in workload or a program: an archive uploaded with the
form (stored as a bundle by ``bundles.services.do_upload`` first) or one of
the tenant's earlier bundles, with an entrypoint, a launcher and variables.
"""

from __future__ import annotations

from typing import Any

from django import forms

from bundles.errors import BundleRefusedError
from bundles.models import CodeBundle
from bundles.services import do_upload
from jobs.choices import Launcher, RecoveryMode
from jobs.program_spec import PROGRAM_FIELDS
from jobs.services import JobSpec, JobValidationError, check_job_spec
from tenancy.models import Tenant
from workers.catalog import WORKLOADS

BUILT_IN, PROGRAM = "builtin", "program"
PROGRAM_ONLY = ("archive", *PROGRAM_FIELDS)


class JobForm(forms.Form):
    """Submit a training job to one of the user's tenants."""

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
        choices=[
            (name, f"{name} — {spec.description}") for name, spec in sorted(WORKLOADS.items())
        ],
    )
    args = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text='JSON object, e.g. {"epochs": 5}. Empty for defaults.',
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
        choices=Launcher.choices,
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
    gpus = forms.IntegerField(min_value=1, initial=2, label="GPUs requested")
    min_gpus = forms.IntegerField(min_value=1, required=False, label="Min GPUs")
    max_gpus = forms.IntegerField(min_value=1, required=False, label="Max GPUs")
    batch_size = forms.IntegerField(min_value=1, required=False, label="Global batch size")
    priority = forms.IntegerField(min_value=0, max_value=100, initial=50)
    recovery = forms.ChoiceField(choices=RecoveryMode.choices, initial=RecoveryMode.CONSISTENT)
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

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        tenant = cleaned.get("tenant")
        if tenant is None or self.errors:
            return cleaned
        data = {k: v for k, v in cleaned.items() if k != "tenant" and v not in (None, "")}
        data.pop("source", None)
        if cleaned.get("source") == PROGRAM:
            data.pop("workload", None)
            data.pop("args", None)
            if not self._take_archive(tenant, data):
                return cleaned
            data.setdefault("code", "")  # the service says a bundle is needed
        else:
            for name in PROGRAM_ONLY:
                data.pop(name, None)
        try:
            self.spec = check_job_spec(tenant=tenant, data=data)
        except JobValidationError as exc:
            for field, messages in exc.errors.items():
                target = field if field in self.fields else None
                for message in messages:
                    self.add_error(target, message)
        return cleaned

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
