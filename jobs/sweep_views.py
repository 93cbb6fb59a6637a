"""The sweep pages: ``/sweeps/`` lists your tenants' sweeps; ``/sweeps/<id>/`` shows its trials, the metric of every trial against step,
hyperparameters against the metric, and the best trial with its checkpoint.

Thin, like ``jobs.views``: the sweep is scoped by ``restrict`` (another tenant's is a
404), the reads are ``jobs.sweeps``'s, the charts are drawn by ``static/js/sweep.js``
from the page's JSON snapshot; cancel goes through ``do_cancel_sweep``.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from jobs.models import Sweep, SweepState
from jobs.sweeps import best_of, do_cancel_sweep, metric_curves, plan_of, trial_rows
from jobs.views import page_action
from tenancy.services import can_write


@login_required
def sweep_list(request: HttpRequest) -> HttpResponse:
    """Your tenants' sweeps, newest first, each linked to its page."""
    sweeps = Sweep.objects.restrict(request.user).select_related("tenant")[:200]
    return render(request, "jobs/sweeps.html", {"sweeps": sweeps})


@login_required
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    """A sweep: its rule, its trials, the charts and the best trial."""
    sweep = get_object_or_404(
        Sweep.objects.restrict(request.user).select_related("tenant"), pk=sweep_id
    )
    trials = trial_rows(sweep)
    best = best_of(sweep)
    snapshot = {
        "id": sweep.pk,
        "metric": sweep.metric,
        "mode": sweep.mode,
        "rungs": list(plan_of(sweep).rungs),
        "trials": trials,
        "curves": {str(index): points for index, points in metric_curves(sweep).items()},
    }
    return render(
        request,
        "jobs/sweep.html",
        {
            "sweep": sweep,
            "rungs": plan_of(sweep).rungs,
            "trials": trials,
            "best": best,
            "snapshot": snapshot,
            "live": sweep.state == SweepState.RUNNING,
            "can_write": can_write(request.user, sweep.tenant),
        },
    )


@login_required
@require_POST
def cancel_sweep(request: HttpRequest, sweep_id: int) -> HttpResponse:
    """Cancel a sweep from its page."""
    sweep = get_object_or_404(Sweep.objects.restrict(request.user), pk=sweep_id)
    return page_action(
        request,
        lambda: do_cancel_sweep(user=request.user, sweep_id=sweep.pk),
        lambda _: f"Sweep {sweep.pk} cancelled.",
        redirect("sweep-page", sweep_id=sweep.pk),
    )
