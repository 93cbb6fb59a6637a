"""Admin page: the shells open now (who, tenant, job, worker, since when, bytes), each with
a Close button.

Staff only (404 for everybody else, as the other cluster pages).  The table is rendered
here and kept fresh by ``static/js/shells.js`` from ``open.json`` every few seconds; a
close is a POST with its CSRF token, through the same service as the API's
(``shells.services.do_request_close``: recorded as the admin's, then the agent ends it).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from portal.cluster_views import admin_only
from shells.models import Shell
from shells.queries import open_shells
from shells.services import do_request_close

REFRESH_SECONDS = 3


@admin_only
@require_GET
def open_shells_page(request: HttpRequest) -> HttpResponse:
    """Every open shell, newest first, with its Close button."""
    rows, total = open_shells()
    return render(
        request,
        "cluster/shells.html",
        {
            "shells": rows,
            "total": total,
            "refresh_seconds": REFRESH_SECONDS,
            "refresh_ms": REFRESH_SECONDS * 1000,
        },
    )


@admin_only
@require_GET
def open_shells_json(request: HttpRequest) -> JsonResponse:
    """The page's rows as JSON (``static/js/shells.js`` redraws the table from it)."""
    rows, total = open_shells()
    return JsonResponse({"shells": [row.as_json() for row in rows], "total": total})


@admin_only
@require_POST
def close_shell(request: HttpRequest, shell_id: str) -> HttpResponse:
    """Close one shell now; the page says whether it was open still."""
    if "\x00" in shell_id:  # PostgreSQL refuses NUL in a query; no shell has one
        raise Http404("no such shell")
    shell = Shell.objects.filter(pk=shell_id).first()
    if shell is None:
        raise Http404("no such shell")
    if do_request_close(shell=shell, by=request.user, now=timezone.now()):
        messages.success(
            request, f"Shell {shell.id[:8]} of {shell.user} in job {shell.job_id} closed."
        )
    else:
        messages.info(request, f"Shell {shell.id[:8]} had ended already.")
    return redirect("cluster-shells")
