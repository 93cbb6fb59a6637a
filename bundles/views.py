"""The Code page: a tenant's uploaded bundles and a form to upload another."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from bundles.errors import BundleRefusedError
from bundles.forms import UploadForm
from bundles.models import CodeBundle
from bundles.services import do_upload
from tenancy.models import Tenant


@login_required
def code_page(request: HttpRequest) -> HttpResponse:
    """List the user's bundles; on a valid POST upload the archive and come back here."""
    tenants = Tenant.objects.writable_by(request.user).order_by("slug")
    form = UploadForm(request.POST or None, request.FILES or None, tenants=tenants)
    if request.method == "POST" and form.is_valid():
        try:
            bundle, created = do_upload(
                user=request.user,
                tenant=form.cleaned_data["tenant"],
                uploaded_file=form.cleaned_data["archive"],
            )
        except BundleRefusedError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            verb = "Uploaded" if created else "Already had"
            messages.success(request, f"{verb} bundle {bundle.sha256} ({bundle.file_count} files).")
            return redirect("code")
    bundles = CodeBundle.objects.restrict(request.user).select_related("tenant")
    return render(
        request,
        "bundles/code.html",
        {"form": form, "bundles": bundles, "can_upload": tenants.exists()},
        status=400 if form.errors else 200,
    )
