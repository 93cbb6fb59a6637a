"""Job pages: submission form, detail with history, cancel; an array's tasks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from jobs.arrays import (
    array_counts,
    array_tasks,
    do_cancel_array,
    do_retry_array,
    do_submit_array,
)
from jobs.choices import TERMINAL_STATES, ArtifactKind
from jobs.forms import JobForm
from jobs.live.snapshots import job_snapshot
from jobs.live.workflows import dependency_rows
from jobs.logs.store import log_workers, tail_lines
from jobs.models import Job, JobArray
from jobs.services import JobError, do_cancel_job, do_submit_job
from tenancy.models import Tenant
from tenancy.services import can_write

_Result = TypeVar("_Result")


def page_action(
    request: HttpRequest,
    act: Callable[[], _Result],
    said: Callable[[_Result], str],
    back: HttpResponse,
) -> HttpResponse:
    """What a page's button does on POST (cancel, retry): the service call ``act``, its
    refusal or ``said`` of its result shown as the page's message, then ``back`` to the page.

    Shared by the job, array and sweep pages, so a refused action reads the same on each.
    """
    try:
        result = act()
    except JobError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, said(result))
    return back


@login_required
def submit_job(request: HttpRequest) -> HttpResponse:
    """Show the submission form; on a valid POST submit the job (or the array) and open its
    page."""
    tenants = Tenant.objects.writable_by(request.user)
    # Only a tenant named in the URL overrides the form's default (the user's only tenant).
    initial = {"tenant": request.GET["tenant"]} if request.GET.get("tenant") else {}
    form = JobForm(
        request.POST or None, request.FILES or None, tenants=tenants, user=request.user,
        initial=initial,
    )  # fmt: skip
    if request.method == "POST" and form.is_valid():
        try:
            return _submitted(request, form)
        except JobError as exc:
            form.add_error(None, exc.message)
    return render(request, "jobs/submit.html", {"form": form, "has_tenants": tenants.exists()})


def _submitted(request: HttpRequest, form: JobForm) -> HttpResponse:
    """Submit what the valid ``form`` holds (an array or a job); the page to open next."""
    tenant = form.cleaned_data["tenant"]
    if form.array_spec is not None:
        array = do_submit_array(user=request.user, tenant=tenant, spec=form.array_spec)
        messages.success(request, f"Array {array.pk} submitted: {array.size} tasks.")
        return redirect("array-page", array_id=array.pk)
    assert form.spec is not None  # a valid form holds one or the other
    job = do_submit_job(user=request.user, tenant=tenant, spec=form.spec)
    messages.success(request, f"Job {job.pk} submitted.")
    return redirect("job-detail", job_id=job.pk)


PAGE_LOG_LINES = 1000
"""Lines of output a job page opens with (the API reads further back)."""

PAGE_ARTIFACTS = 200
"""Stored objects a job page lists (the API pages through all of them)."""


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """A job live: its charts (GPUs, throughput, loss, logged metrics), artifacts, history, log."""
    job = get_object_or_404(
        Job.objects.restrict(request.user).select_related("tenant", "code", "array"), pk=job_id
    )
    log_lines = tail_lines(job, count=PAGE_LOG_LINES)
    # The final checkpoint first: it is what most people come to download.
    artifacts = sorted(
        job.artifacts.all()[:PAGE_ARTIFACTS],
        key=lambda a: (a.kind != ArtifactKind.FINAL, -a.created_at.timestamp(), -a.pk),
    )
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "log_lines": log_lines,
            "log_cursor": log_lines[-1].cursor if log_lines else "",
            "log_workers": log_workers(job),
            "events": job.events.all(),
            "artifacts": artifacts,
            "snapshot": job_snapshot(job),
            "dependencies": dependency_rows(job),
            "can_cancel": job.state not in TERMINAL_STATES and can_write(request.user, job.tenant),
        },
    )


@login_required
@require_POST
def cancel_job(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel a job from its page."""
    job = get_object_or_404(Job.objects.restrict(request.user), pk=job_id)
    return page_action(
        request,
        lambda: do_cancel_job(user=request.user, job_id=job.pk),
        lambda _: f"Job {job.pk} cancelled.",
        redirect("job-detail", job_id=job.pk),
    )


@login_required
def array_detail(request: HttpRequest, array_id: int) -> HttpResponse:
    """An array: its counts per state and each task's latest attempt, with cancel and retry,
    kept live by ``static/js/array.js``."""
    array = get_object_or_404(
        JobArray.objects.restrict(request.user).select_related("tenant"), pk=array_id
    )
    counts = array_counts([array])[array.pk]
    tasks = array_tasks(array)
    return render(
        request,
        "jobs/array.html",
        {
            "array": array,
            "counts": dict(sorted(counts.items())),
            "tasks": tasks,
            # What static/js/array.js starts from (the shape of GET /api/v1/arrays/<id>/).
            "snapshot": {"id": array.pk, "tasks": tasks},
            "live": any(state not in TERMINAL_STATES for state in counts),
            "can_write": can_write(request.user, array.tenant),
        },
    )


@login_required
@require_POST
def cancel_array(request: HttpRequest, array_id: int) -> HttpResponse:
    """Cancel every task of an array from its page."""
    array = get_object_or_404(JobArray.objects.restrict(request.user), pk=array_id)
    return page_action(
        request,
        lambda: do_cancel_array(user=request.user, array_id=array.pk),
        lambda _: f"Array {array.pk} cancelled.",
        redirect("array-page", array_id=array.pk),
    )


@login_required
@require_POST
def retry_array(request: HttpRequest, array_id: int) -> HttpResponse:
    """Submit again an array's failed tasks from its page."""
    array = get_object_or_404(JobArray.objects.restrict(request.user), pk=array_id)
    return page_action(
        request,
        lambda: do_retry_array(user=request.user, array_id=array.pk),
        lambda retried: f"{len(retried)} failed task(s) of array {array.pk} retried.",
        redirect("array-page", array_id=array.pk),
    )
