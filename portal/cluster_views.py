"""Admin pages: the live cluster view and the topology editor (staff only; 404 for others)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from inventory.forms import (
    SERVER_ACTIONS,
    AcceptForm,
    GeneratorForm,
    ImportForm,
    ServerForm,
    field_for_message,
)
from inventory.listing import health_word, pending_rows, server_rows, utilization_by_type
from inventory.models import Gpu, Server
from inventory.registration import do_accept_server
from inventory.services import (
    InventoryError,
    current_spec,
    do_add_server,
    do_clear_gpu_suspect,
    do_load_topology,
    do_remove_server,
    do_set_server_state,
    export_topology,
    suspect_gpus,
)
from portal.cluster_data import DEFAULT_WINDOW, WINDOWS, cluster_snapshot
from tenancy.authentication import token_or_login_required


def _staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise Http404("not found")
        return view(request, *args, **kwargs)

    return wrapper


def admin_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Cluster admins (staff) only; everybody else gets a 404, as for another tenant's job."""
    return login_required(_staff_only(view))


def admin_only_data(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``admin_only`` for live data: an admin's API token is accepted as well as a session."""
    return token_or_login_required(_staff_only(view))


@admin_only
@require_GET
def cluster(request: HttpRequest) -> HttpResponse:
    """The live cluster view: utilization heatmap, topology, queue and efficiency, JCT."""
    window = request.GET.get("window", DEFAULT_WINDOW)
    busy = set(Gpu.objects.filter(assignment__isnull=False).values_list("index", flat=True))
    return render(
        request,
        "cluster/view.html",
        {
            "snapshot": cluster_snapshot(window),
            "windows": list(WINDOWS),
            "window": window,
            "server_rows": server_rows(),
            "pending": pending_rows(),
            "by_type": utilization_by_type(busy),
        },
    )


@admin_only_data
@require_GET
def cluster_json(request: HttpRequest) -> JsonResponse:
    """The cluster view's snapshot (its resync)."""
    return JsonResponse(cluster_snapshot(request.GET.get("window", DEFAULT_WINDOW)))


def with_health(servers: Iterable[Server]) -> list[Server]:
    """The servers, each with ``health``: its last report's health in a word."""
    out = list(servers)
    for server in out:
        info = server.agent_info if isinstance(server.agent_info, dict) else {}
        server.health = health_word(info.get("hardware"))  # type: ignore[attr-defined]
    return out


def _editor(request: HttpRequest, **forms: Any) -> HttpResponse:
    context = {
        "generator": forms.get("generator") or GeneratorForm(),
        "importer": forms.get("importer") or ImportForm(),
        "server_form": forms.get("server_form") or ServerForm(),
        "spec": current_spec(),
        "servers": with_health(Server.objects.all()),
        "busy": set(
            Server.objects.filter(gpu_set__assignment__isnull=False).values_list("node", flat=True)
        ),
        "suspect": suspect_gpus(),
        "pending": pending_rows(),
        "accept_form": forms.get("accept_form") or AcceptForm(),
    }
    status = 400 if any(f is not None and f.errors for f in forms.values()) else 200
    return render(request, "cluster/topology.html", context, status=status)


def _load(
    request: HttpRequest,
    data: Any,
    form: Any,
    field: str | Callable[[str], str | None] | None,
) -> HttpResponse | None:
    """Load a topology; on refusal put the error on ``field`` (or the field it names)."""
    try:
        result = do_load_topology(data)
    except InventoryError as exc:
        form.add_error(field(str(exc)) if callable(field) else field, str(exc))
        return None
    if result.unchanged:
        messages.info(request, "The topology already matches: nothing changed.")
    else:
        messages.success(
            request,
            f"Topology loaded: {result.servers_added} servers added, "
            f"{result.servers_removed} removed.",
        )
    return redirect("topology")


@admin_only
def topology(request: HttpRequest) -> HttpResponse:
    """The topology editor: generate, import, add servers (POST ``form`` names which)."""
    if request.method != "POST":
        return _editor(request)
    which = request.POST.get("form")
    if which == "generate":
        generator = GeneratorForm(request.POST)
        if generator.is_valid():
            done = _load(request, generator.spec(), generator, field_for_message)
            if done is not None:
                return done
        return _editor(request, generator=generator)
    if which == "import":
        importer = ImportForm(request.POST, request.FILES)
        if importer.is_valid():
            target = "upload" if importer.cleaned_data.get("upload") else "document"
            done = _load(request, importer.cleaned_data["data"], importer, target)
            if done is not None:
                return done
        return _editor(request, importer=importer)
    if which == "accept":
        return _accept(request, AcceptForm(request.POST))
    if which == "server":
        server_form = ServerForm(request.POST)
        if server_form.is_valid():
            try:
                do_add_server(**server_form.cleaned_data)
            except InventoryError as exc:
                message = str(exc)
                field = next((f for f in ("leaf", "slot", "node") if f in message), None)
                server_form.add_error(field, message)
            else:
                messages.success(request, f"Server {server_form.cleaned_data['node']} added.")
                return redirect("topology")
        return _editor(request, server_form=server_form)
    messages.error(request, "Unknown form.")
    return redirect("topology")


def _accept(request: HttpRequest, form: AcceptForm) -> HttpResponse:
    """Accept a pending server; a refusal is a 400 with the error on its field."""
    if form.is_valid():
        try:
            server = do_accept_server(user=request.user, **form.accept_fields())
        except InventoryError as exc:
            named = exc.field or ""
            field = named if named in form.fields else ("pool" if "labels" in named else None)
            form.add_error(field, str(exc))
        else:
            messages.success(request, f"Server {server.node} accepted at leaf {server.leaf}.")
            return redirect("topology")
    return _editor(request, accept_form=form)


@admin_only
@require_POST
def server_action(request: HttpRequest, node: str, action: str) -> HttpResponse:
    """Drain, undrain, mark down or remove one server; refusals come back as messages."""
    if "\x00" in node:  # no server has one, and PostgreSQL refuses NUL in a query
        raise Http404("no such server")
    try:
        if action == "remove":
            do_remove_server(node=node)
            messages.success(request, f"Server {node} removed.")
        elif action in SERVER_ACTIONS:
            state = SERVER_ACTIONS[action]
            do_set_server_state(node=node, state=state, user=request.user)  # "drained by alice"
            messages.success(request, f"Server {node} is now {state}.")
        else:
            raise Http404("unknown action")
    except InventoryError as exc:
        messages.error(request, str(exc))
    return redirect("topology")


@admin_only
@require_POST
def gpu_clear_suspect(request: HttpRequest, index: int) -> HttpResponse:
    """Return a suspect GPU to service before its cool-down ends (audited)."""
    try:
        do_clear_gpu_suspect(gpu=index, user=request.user)
        messages.success(request, f"GPU {index} is no longer suspect: new jobs may use it.")
    except InventoryError as exc:
        messages.error(request, str(exc))
    return redirect("topology")


@admin_only
@require_GET
def topology_export(request: HttpRequest) -> HttpResponse:
    """The current topology as a JSON document, downloaded."""
    try:
        document = export_topology()
    except InventoryError as exc:
        messages.error(request, str(exc))
        return redirect("topology")
    response = HttpResponse(json.dumps(document, indent=2), content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="topology.json"'
    return response
