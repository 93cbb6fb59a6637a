"""The session pages: ``/sessions/`` lists your tenants' sessions with a start form;
``/sessions/<id>/`` shows one (state, GPUs, idle countdown, its JupyterLab link, stop).

Thin, like ``jobs.views``: sessions are scoped by ``restrict`` (another tenant's is a 404),
starts and stops go through ``jobs.session_services``. The lab itself
(``/sessions/<id>/lab/``) is the proxy's and its link (``/sessions/<id>/lab-open/``)
``portal.lab_origin``'s, not routed here.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from jobs.api.sessions import lab_url
from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, JobKind
from jobs.errors import JobError
from jobs.models import Job
from jobs.session_cull import idle_deadline
from jobs.session_forms import SessionForm
from jobs.session_services import check_session_spec, do_start_session, do_stop_session, may_stop
from jobs.sessions import may_open
from jobs.views import page_action
from tenancy.models import Tenant

PAGE_SESSIONS = 200


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    """Your tenants' sessions, newest first; the form that starts one (POST)."""
    tenants = Tenant.objects.writable_by(request.user)
    form = SessionForm(request.POST or None, tenants=tenants)
    if request.method == "POST" and form.is_valid():
        tenant = tenants.get(slug=form.cleaned_data["tenant"])
        try:
            spec = check_session_spec(tenant=tenant, data=form.start_body())
            job = do_start_session(user=request.user, tenant=tenant, spec=spec)
        except JobError as exc:
            for field, errors in (exc.errors or {"": [exc.message]}).items():
                for error in errors:
                    form.add_error(field if field in form.fields else None, error)
        else:
            messages.success(request, f"Session {job.pk} started: it opens once it runs.")
            return redirect("session-page", job_id=job.pk)
    sessions = (
        Job.objects.restrict(request.user)
        .filter(kind=JobKind.SESSION)
        .select_related("tenant", "submitter")[:PAGE_SESSIONS]
    )
    return render(
        request,
        "sessions/list.html",
        {"form": form, "sessions": sessions, "has_tenants": tenants.exists()},
    )


@login_required
def session_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """One session: state, GPUs, idle countdown, lifetime, the lab link, the stop button."""
    job = get_object_or_404(
        Job.objects.restrict(request.user)
        .filter(kind=JobKind.SESSION)
        .select_related("tenant", "submitter", "code"),
        pk=job_id,
    )
    running = job.state in ACTIVE_STATES
    deadline = idle_deadline(job.last_activity_at, job.started_at, job.idle_timeout_s)
    return render(
        request,
        "sessions/detail.html",
        {
            "job": job,
            "running": running,
            "ended": job.state in TERMINAL_STATES,
            "idle_deadline": deadline if running else None,
            "lab_url": lab_url(job.pk),
            "can_open": may_open(request.user, job),
            "can_stop": may_stop(request.user, job),
            "gpus": [slot.gpu for slot in job.gpu_slots.select_related("gpu__server")],
            "events": job.events.order_by("-at", "-id")[:20],
        },
    )


@login_required
@require_POST
def stop_session_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """Stop a session from its page."""
    job = get_object_or_404(
        Job.objects.restrict(request.user).filter(kind=JobKind.SESSION), pk=job_id
    )
    return page_action(
        request,
        lambda: do_stop_session(user=request.user, job_id=job.pk),
        lambda _: f"Session {job.pk} stopped.",
        redirect("session-page", job_id=job.pk),
    )
