"""The job submission form; its rules are the service's (``check_job_spec``)."""

from __future__ import annotations

from typing import Any

from django import forms

from jobs.choices import RecoveryMode
from jobs.services import JobSpec, JobValidationError, check_job_spec
from tenancy.models import Tenant
from workers.catalog import WORKLOADS


class JobForm(forms.Form):
    """Submit a training job to one of the user's tenants."""

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), to_field_name="slug")
    name = forms.CharField(max_length=100)
    workload = forms.ChoiceField(
        choices=[(name, f"{name} — {spec.description}") for name, spec in sorted(WORKLOADS.items())]
    )
    args = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text='JSON object, e.g. {"epochs": 5}. Empty for defaults.',
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

    def __init__(self, *args: Any, tenants: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        if tenants.count() == 1:
            self.fields["tenant"].initial = tenants.first()
        self.spec: JobSpec | None = None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        tenant = cleaned.get("tenant")
        if tenant is None or self.errors:
            return cleaned
        data = {k: v for k, v in cleaned.items() if k != "tenant" and v not in (None, "")}
        try:
            self.spec = check_job_spec(tenant=tenant, data=data)
        except JobValidationError as exc:
            for field, messages in exc.errors.items():
                target = field if field in self.fields else None
                for message in messages:
                    self.add_error(target, message)
        return cleaned
