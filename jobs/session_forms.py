"""The start form of the sessions page: what a person fills in, turned into the same start
body the API takes (``jobs.session_services.check_session_spec`` checks it)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from bundles.models import CodeBundle
from jobs.choices import LabAccess
from tenancy.models import Tenant

PRIORITY_CHOICES = [("normal", "normal"), ("high", "high"), ("low", "low")]
MAX_REQUIREMENTS_TEXT = 8000


class SessionForm(forms.Form):
    """Start a session: tenant, size, limits (blank: the tenant's defaults), who may open it,
    and optionally the tenant's code and extra packages."""

    tenant = forms.ChoiceField()
    name = forms.CharField(max_length=100, required=False, initial="session")
    gpus = forms.IntegerField(min_value=1, initial=1, label="GPUs")
    priority = forms.ChoiceField(choices=PRIORITY_CHOICES, initial="normal",
                                 help_text="A higher class may preempt a session; batch work "
                                 "of its own or a lower class never does.")  # fmt: skip
    idle_timeout_s = forms.IntegerField(
        min_value=1, required=False, label="Idle timeout (s)",
        help_text="Stopped after this long without activity; blank: the tenant's default.",
    )  # fmt: skip
    max_lifetime_s = forms.IntegerField(
        min_value=1, required=False, label="Lifetime (s)",
        help_text="Stopped this long after it starts; blank: the tenant's default.",
    )  # fmt: skip
    lab_access = forms.ChoiceField(choices=LabAccess.choices, initial=LabAccess.CREATOR,
                                   label="Who may open it")  # fmt: skip
    code = forms.ChoiceField(required=False, label="Start from code",
                             help_text="One of your tenant's bundles; blank: an empty home.")  # fmt: skip
    requirements = forms.CharField(
        required=False, max_length=MAX_REQUIREMENTS_TEXT, label="Packages",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Python packages beyond the node's, one per line (e.g. einops==0.8.1).",
    )  # fmt: skip
    gpu_types = forms.CharField(required=False, label="GPU types",
                                help_text="Accepted types, preferred first: h100-80g,a100-40g.")  # fmt: skip

    def __init__(self, *args: Any, tenants: QuerySet[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        slugs = list(tenants.values_list("slug", flat=True))
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = [(slug, slug) for slug in slugs]
        if len(slugs) == 1:
            tenant_field.initial = slugs[0]
        bundles = CodeBundle.objects.filter(tenant__slug__in=slugs).select_related("tenant")[:100]
        code_field = self.fields["code"]
        assert isinstance(code_field, forms.ChoiceField)
        code_field.choices = [("", "—")] + [
            (b.sha256, f"{b.tenant.slug}: {b.sha256[:12]} ({b.file_count} files)") for b in bundles
        ]

    def start_body(self) -> dict[str, Any]:
        """The valid form as the body ``check_session_spec`` reads (blank fields left out)."""
        data = self.cleaned_data
        body: dict[str, Any] = {
            "name": data.get("name") or "session",
            "gpus": data["gpus"],
            "priority": data["priority"],
            "lab_access": data["lab_access"],
        }
        for key in ("idle_timeout_s", "max_lifetime_s", "code"):
            if data.get(key) not in (None, ""):
                body[key] = data[key]
        lines = [line.strip() for line in (data.get("requirements") or "").splitlines()]
        if requirements := [line for line in lines if line]:
            body["environment"] = {"requirements": requirements}
        if types := data.get("gpu_types"):
            body["gpu_types"] = types
        return body
