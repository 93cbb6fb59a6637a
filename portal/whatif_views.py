"""The what-if page (admins): start a simulated comparison, follow it, read the report."""

from __future__ import annotations

import re

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from portal.cluster_views import admin_only
from portal.whatif import WhatIfForm, get_run, run_title, start_run

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


@admin_only
def whatif(request: HttpRequest) -> HttpResponse:
    """The form; a valid POST starts a run and opens its page."""
    form = WhatIfForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        params = {
            k: data[k]
            for k in (
                "source",
                "policies",
                "placements",
                "total_gpus",
                "gpus_per_server",
                "leaves",
                "elastic",
                "duration_scale",
            )
        }
        return redirect("whatif-run", run_id=start_run(params, data.get("upload_text")))
    status = 400 if form.is_bound and form.errors else 200
    return render(request, "whatif/form.html", {"form": form}, status=status)


def _run_or_404(run_id: str) -> dict[str, object]:
    state = get_run(run_id) if RUN_ID.match(run_id) else None
    if state is None:
        raise Http404("no such run (runs are kept for a day)")
    return state


@admin_only
@require_GET
def whatif_run(request: HttpRequest, run_id: str) -> HttpResponse:
    """A run: progress bar while it runs, the comparison when done."""
    state = _run_or_404(run_id)
    params = state["params"]
    assert isinstance(params, dict)
    return render(
        request, "whatif/run.html", {"run_id": run_id, "params": params, "title": run_title(params)}
    )


@admin_only
@require_GET
def whatif_run_json(request: HttpRequest, run_id: str) -> JsonResponse:
    """The run's state, polled by its page."""
    state = dict(_run_or_404(run_id))
    state.pop("upload", None)
    return JsonResponse(state)
