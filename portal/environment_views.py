"""Admin page: every node's environment cache as its agent last reported it, and evictions.

Staff only (404 for everybody else, as the other cluster pages); an eviction
is a POST with its CSRF token, audited, and sent to the node's agent, whose
answer shows in the page's list of evictions.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from jobs.environment_caches import (
    EvictionError,
    do_request_eviction,
    node_caches,
    recent_evictions,
)
from portal.cluster_views import admin_only


@admin_only
@require_GET
def environments(request: HttpRequest) -> HttpResponse:
    """Per node: its cached environments (key, packages, size, last use, in use) and its
    total against its cap; an Evict button for each; the latest evictions and their answers."""
    return render(
        request,
        "cluster/environments.html",
        {"nodes": node_caches(), "evictions": recent_evictions()},
    )


@admin_only
@require_POST
def evict_environment(request: HttpRequest, node: str, key: str) -> HttpResponse:
    """Ask ``node``'s agent to evict environment ``key``; the answer comes later."""
    if "\x00" in node:  # no server has one, and PostgreSQL refuses NUL in a query
        raise Http404("no such server")
    try:
        do_request_eviction(node=node, key=key, user=request.user)
    except EvictionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"Eviction of {key[:12]} sent to {node}; its answer shows below once the agent replies.",
        )
    return redirect("environments")
