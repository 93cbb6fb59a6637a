"""The upload form of the Code page; its rules are the service's (``do_upload``)."""

from __future__ import annotations

from typing import Any

from django import forms

from tenancy.models import Tenant


class UploadForm(forms.Form):
    """Upload a code archive to one of the user's tenants."""

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), to_field_name="slug")
    archive = forms.FileField(help_text="A .tar.gz, .tgz or .zip archive of your program.")

    def __init__(self, *args: Any, tenants: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        only = list(tenants[:2])
        if len(only) == 1:  # the user's only tenant is the default
            self.fields["tenant"].initial = only[0]
