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
    RetypeForm,
    ServerForm,
    field_for_message,
)
from inventory.listing import pending_rows, server_rows, utilization_by_type
from inventory.models import Gpu, Server
from inventory.registration import do_accept_server, do_forget_pending_server, health_word
from inventory.services import (
    InventoryError,
    current_spec,
    do_add_server,
    do_clear_gpu_suspect,
    do_load_topology,
    do_remove_server,
    do_set_server_state,
    do_set_server_type,
    export_topology,
    suspect_gpus,
)
from portal.cluster_data import DEFAULT_WINDOW, WINDOWS, cluster_snapshot, type_colours
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
    snapshot = cluster_snapshot(window)
    return render(
        request,
        "cluster/view.html",
        {
            "snapshot": snapshot,
            "windows": list(WINDOWS),
            "window": window,
            "server_rows": server_rows(),
            "pending": snapshot["pending"],
            "pools": snapshot.get("pools", []),
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


def leaf_map(spec: Any, servers: list[Server], colours: dict[str, str]) -> list[dict[str, Any]]:
    """The editor's picture: per leaf, its slots in order, each a server (type colour, pool)
    or None for a free slot."""
    if spec is None:
        return []
    at = {(s.leaf, s.slot): s for s in servers}
    return [
        {
            "leaf": leaf,
            "slots": [
                None
                if (leaf, slot) not in at
                else {"server": at[(leaf, slot)], "colour": colours[at[(leaf, slot)].gpu_type]}
                for slot in range(spec.servers_per_leaf)
            ],
        }
        for leaf in range(spec.leaves)
    ]


def legend_rows(servers: list[Server], colours: dict[str, str]) -> dict[str, list[Any]]:
    """The editor's legend: each GPU type (colour, servers) and each pool (servers)."""
    types: dict[str, int] = {}
    pools: dict[str, int] = {}
    for server in servers:
        types[server.gpu_type] = types.get(server.gpu_type, 0) + 1
        pool = str((server.labels or {}).get("pool", ""))
        pools[pool] = pools.get(pool, 0) + 1
    return {
        "types": [(t, colours[t], n) for t, n in sorted(types.items())],
        "pools": sorted(pools.items()),
    }


def _editor(request: HttpRequest, **forms: Any) -> HttpResponse:
    servers = with_health(Server.objects.all())
    colours = type_colours(s.gpu_type for s in servers)
    for server in servers:
        server.colour = colours[server.gpu_type]  # type: ignore[attr-defined]
    spec = current_spec()
    context = {
        "generator": forms.get("generator") or GeneratorForm(),
        "importer": forms.get("importer") or ImportForm(),
        "server_form": forms.get("server_form") or ServerForm(),
        "spec": spec,
        "servers": servers,
        "leaf_map": leaf_map(spec, servers, colours),
        "legend": legend_rows(servers, colours),
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
    if which == "forget":
        return _forget(request)
    if which == "retype":
        return _retype(request, RetypeForm(request.POST))
    if which == "server":
        server_form = ServerForm(request.POST)
        if server_form.is_valid():
            try:
                do_add_server(**server_form.add_fields())
            except InventoryError as exc:
                message = str(exc)
                named = "pool" if (exc.field or "").startswith("labels") else exc.field
                field = named if named in server_form.fields else None
                field = field or next((f for f in ("leaf", "slot", "node") if f in message), None)
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


def _retype(request: HttpRequest, form: RetypeForm) -> HttpResponse:
    """Set a server's GPU type and pool; an unknown server is a 404, a refusal a message."""
    if not form.is_valid():
        messages.error(
            request, "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())
        )
        return redirect("topology")
    server = Server.objects.filter(node=form.cleaned_data["node"]).first()
    if server is None:
        raise Http404("no such server")
    try:
        do_set_server_type(user=request.user, **form.retype_fields(server.labels))
    except InventoryError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Server {server.node}: type and pool saved.")
    return redirect("topology")


def _forget(request: HttpRequest) -> HttpResponse:
    """Forget a pending server (audited); one that is not listed is a 404 that changes nothing."""
    raw = request.POST.get("pending", "")
    if not raw.isdigit():
        raise Http404("no such pending server")
    try:
        do_forget_pending_server(pending=int(raw), user=request.user)
    except InventoryError:
        raise Http404("no such pending server") from None
    messages.success(
        request, "Pending server forgotten: if its agent reports again, it comes back here."
    )
    return redirect("topology")


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
