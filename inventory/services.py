"""Inventory services: load the fabric from a spec, add/remove/drain servers, heartbeats.

Also suspect GPUs: a straggler report marks its GPU suspect for a cool-down
(``do_mark_gpu_suspect``, the control plane's own action), an admin may clear
the mark earlier (``do_clear_gpu_suspect``, audited).

Every write to ``Fabric``, ``Server`` and ``Gpu`` goes through here. Changes
that would orphan a running job (take away a GPU it holds, renumber the
fabric under it) are refused with ``InventoryError``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Field, Max, Min, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now
from django.utils import timezone

from audit import services as audit
from audit.context import current_actor
from fabric.errors import TopologyError
from fabric.topology import FabricSpec
from inventory.limits import TopologyLimits, TopologyTooLarge, check_topology_size
from inventory.models import Fabric, Gpu, PendingServer, Server, ServerState
from inventory.server_types import (
    TYPED_FIELDS,
    UNTYPED,
    ServerType,
    ServerTypeError,
    check_labels,
    check_server_type,
    check_type_slug,
)
from utilities.realtime import CLUSTER_GROUP, broadcast_on_commit

NODE_NAME_MAX = 64
MISSED_HEARTBEATS = "missed heartbeats"
STATE_ACTIONS = {
    ServerState.DRAINING: ("server.drain", "drained"),
    ServerState.UP: ("server.undrain", "returned to service"),
    ServerState.DOWN: ("server.down", "marked down"),
}
"""A state a person sets: its audit action and the verb of its reason ("drained by alice")."""


class InventoryError(ValueError):
    """A refused inventory change, with a message for the admin (``field``: the key at fault)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InventoryConflict(InventoryError):
    """A refused change that the inventory's present state forbids (jobs hold the GPUs)."""


@dataclass(frozen=True)
class PlannedServer:
    """A server a topology document names: its position, node name and what it is."""

    leaf: int
    slot: int
    node: str
    kind: ServerType = UNTYPED


@dataclass(frozen=True)
class LoadResult:
    """What ``do_load_topology`` changed."""

    created: bool
    servers_added: int
    servers_removed: int
    unchanged: bool


def default_node_name(spec: FabricSpec, leaf: int, slot: int) -> str:
    """The agent node name of the server at (leaf, slot): ``node-<server index>``."""
    return f"node-{leaf * spec.servers_per_leaf + slot}"


def check_fabric_spec(data: Any) -> tuple[FabricSpec, list[PlannedServer]]:
    """Validate a topology document; return the spec and its (leaf, slot, node) servers.

    The document is the fabric spec (``leaves``, ``spines``, ``servers_per_leaf``,
    ``gpus_per_server``, optional ``link_gbps``) plus an optional ``servers``
    list of ``{"leaf", "slot", "node"}`` naming the servers that exist (all
    positions, named ``node-<i>``, when it is absent), each optionally typed
    (``inventory.server_types``: ``gpu_type``, ``gpu_model``, ``labels``...).
    Sizes are bounded by ``inventory.limits`` (the ``TOPOLOGY_MAX_*`` settings).
    """
    if not isinstance(data, Mapping):
        raise InventoryError("a topology must be a JSON object")
    body = dict(data)
    servers_raw = body.pop("servers", None)
    limits = TopologyLimits.from_settings()
    try:
        spec = FabricSpec.from_dict(body)
        check_topology_size(spec, limits)
    except (TopologyError, TopologyTooLarge) as exc:
        raise InventoryError(str(exc)) from None
    if servers_raw is None:
        servers = [
            PlannedServer(leaf, slot, default_node_name(spec, leaf, slot))
            for leaf in range(spec.leaves)
            for slot in range(spec.servers_per_leaf)
        ]
    else:
        servers = _check_server_list(spec, servers_raw)
    return spec, servers


_SERVER_KEYS = {"leaf", "slot", "node"}
_SERVER_OPTIONAL = {*TYPED_FIELDS, "gpu_count"}


def _check_server_list(spec: FabricSpec, raw: Any) -> list[PlannedServer]:
    if not isinstance(raw, list):
        raise InventoryError("servers must be a list of {leaf, slot, node}", "servers")
    positions = spec.leaves * spec.servers_per_leaf
    if len(raw) > positions:
        raise InventoryError(
            f"servers lists {len(raw)} servers: the fabric has {positions} places", "servers"
        )
    servers = [_check_server_entry(spec, entry, f"servers[{i}]") for i, entry in enumerate(raw)]
    if len({(s.leaf, s.slot) for s in servers}) != len(servers):
        raise InventoryError("two servers share a position", "servers")
    if len({s.node for s in servers}) != len(servers):
        raise InventoryError("two servers share a node name", "servers")
    return servers


def _check_server_entry(spec: FabricSpec, entry: Any, path: str) -> PlannedServer:
    """One server of a topology document: position, name, optional typed resources."""
    if not isinstance(entry, Mapping) or not _SERVER_KEYS <= set(entry) <= (
        _SERVER_KEYS | _SERVER_OPTIONAL
    ):
        raise InventoryError(
            f"{path} must have leaf, slot and node, and only these optional keys: "
            f"{', '.join(sorted(_SERVER_OPTIONAL))}",
            path,
        )
    check_position(spec, entry["leaf"], entry["slot"])
    check_node_name(entry["node"])
    count = entry.get("gpu_count", spec.gpus_per_server)
    if isinstance(count, bool) or count != spec.gpus_per_server:
        raise InventoryError(
            f"{path}.gpu_count: must equal gpus_per_server ({spec.gpus_per_server})",
            f"{path}.gpu_count",
        )
    try:
        kind = check_server_type(entry, path)
    except ServerTypeError as exc:
        raise InventoryError(str(exc), exc.field) from None
    return PlannedServer(entry["leaf"], entry["slot"], entry["node"], kind)


def check_position(spec: FabricSpec, leaf: Any, slot: Any) -> None:
    """Refuse a server position outside the fabric."""
    for name, value, bound in (("leaf", leaf, spec.leaves), ("slot", slot, spec.servers_per_leaf)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            raise InventoryError(f"{name} must be an integer from 0 to {bound - 1}", name)


def check_node_name(node: Any) -> None:
    """Node names become Celery queue names (``agent.<node>``): keep them plain."""
    if (
        not isinstance(node, str)
        or not node
        or len(node) > NODE_NAME_MAX
        or not all(c.isalnum() or c in "-_." for c in node)
    ):
        raise InventoryError(
            f"invalid node name {node!r}: letters, digits, '-', '_', '.' (max {NODE_NAME_MAX})"
        )


def current_spec() -> FabricSpec | None:
    """The fabric's spec, or None before a topology is loaded."""
    fabric = Fabric.objects.filter(pk=1).first()
    return fabric.spec() if fabric else None


def _allocated_gpu_indices() -> set[int]:
    """GPUs some job holds, read through the reverse of the jobs app's assignment relation.

    Inventory sits below jobs: it never imports them, it only asks which GPUs
    have an ``assignment``.
    """
    return set(Gpu.objects.filter(assignment__isnull=False).values_list("index", flat=True))


def create_server_rows(
    spec: FabricSpec,
    leaf: int,
    slot: int,
    node: str,
    kind: ServerType = UNTYPED,
    uuids: tuple[str, ...] = (),
) -> Server:
    """A server row and its GPU rows (``uuids``: each GPU's, where known)."""
    server = Server.objects.create(
        node=node, leaf=leaf, slot=slot, gpu_count=spec.gpus_per_server, **kind.as_fields()
    )
    first = leaf * spec.gpus_per_leaf + slot * spec.gpus_per_server
    Gpu.objects.bulk_create(
        Gpu(
            index=first + local,
            server=server,
            local=local,
            uuid=uuids[local] if local < len(uuids) else "",
        )
        for local in range(spec.gpus_per_server)
    )
    return server


def inventory_summary() -> dict[str, Any]:
    """The inventory in a few numbers (the audit log's before/after of a topology load)."""
    spec = current_spec()
    return {
        "fabric": None if spec is None else spec.to_dict(),
        "servers": Server.objects.count(),
        "gpus": Gpu.objects.count(),
    }


@transaction.atomic
def do_load_topology(data: Any) -> LoadResult:
    """Make the inventory match a topology document; idempotent.

    Refuses (and changes nothing) when a running job holds a GPU that the new
    topology would remove or renumber.  A load that changes something is
    audited as ``topology.load`` with counts before and after (not the document).
    """
    spec, servers = check_fabric_spec(data)
    fabric = Fabric.objects.select_for_update().filter(pk=1).first()
    before = inventory_summary()
    allocated = _allocated_gpu_indices()
    wanted = {(s.leaf, s.slot): s.node for s in servers}
    kinds = {s.node: s.kind for s in servers}
    if fabric is not None and fabric.spec() != spec:
        if allocated:
            raise InventoryError(
                f"running jobs hold {len(allocated)} GPUs: resizing the fabric would orphan "
                "them; drain the cluster first"
            )
        Server.objects.all().delete()
        fabric.delete()
        fabric = None
    created = fabric is None
    if created:
        Fabric.objects.create(
            pk=1,
            leaves=spec.leaves,
            spines=spec.spines,
            servers_per_leaf=spec.servers_per_leaf,
            gpus_per_server=spec.gpus_per_server,
            link_gbps=spec.link_gbps,
        )
    existing = {(s.leaf, s.slot): s for s in Server.objects.all()}
    removed = 0
    for position, server in existing.items():
        if wanted.get(position) == server.node:
            continue
        held = set(server.gpu_set.values_list("index", flat=True)) & allocated
        if held:
            raise InventoryError(
                f"server {server.node} runs jobs on GPUs {sorted(held)}: drain it before "
                "removing or renaming it"
            )
        server.delete()
        removed += 1
    names_in_use = set(Server.objects.values_list("node", flat=True))
    added = 0
    for (leaf, slot), node in sorted(wanted.items()):
        if Server.objects.filter(leaf=leaf, slot=slot).exists():
            continue
        if node in names_in_use:
            raise InventoryError(f"node name {node!r} is already used by another server")
        create_server_rows(spec, leaf, slot, node, kinds[node])
        added += 1
    # A node the document places is no longer waiting for an admin.
    PendingServer.objects.filter(node__in=list(wanted.values())).delete()
    retyped = _retype_servers(kinds)
    unchanged = not created and not added and not removed and not retyped
    if not unchanged:
        audit.record(
            "topology.load",
            object_type="inventory.fabric",
            object_id="1",
            object_repr=str(Fabric.objects.get(pk=1)),
            before=before,
            after={
                **inventory_summary(),
                "servers_added": added,
                "servers_removed": removed,
                "servers_retyped": retyped,
            },
        )
        broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
    return LoadResult(created, added, removed, unchanged)


def _retype_servers(kinds: Mapping[str, ServerType]) -> int:
    """Give the document's kept servers its typed resources; how many changed."""
    changed = 0
    for server in Server.objects.filter(node__in=list(kinds)):
        fields = kinds[server.node].as_fields()
        if all(getattr(server, name) == value for name, value in fields.items()):
            continue
        for name, value in fields.items():
            setattr(server, name, value)
        server.save(update_fields=list(fields))
        changed += 1
    return changed


def export_topology() -> dict[str, Any]:
    """The current inventory as a topology document (the format ``do_load_topology`` reads)."""
    spec = current_spec()
    if spec is None:
        raise InventoryError("no topology is loaded")
    document = spec.to_dict()
    document["servers"] = [
        {"leaf": row["leaf"], "slot": row["slot"], "node": row["node"]}
        | {name: row[name] for name in TYPED_FIELDS if row[name] != UNTYPED.as_fields()[name]}
        for row in Server.objects.values("leaf", "slot", "node", *TYPED_FIELDS)
    ]
    return document


@transaction.atomic
def do_add_server(
    *, leaf: int, slot: int, node: str, gpu_type: Any = None, labels: Any = None
) -> Server:
    """Add a server at a free position of the fabric, of GPU type ``gpu_type`` (default:
    ``default``) with ``labels`` (e.g. its pool); a pending server of that name is placed
    by this, so its pending row goes.  Refused (``InventoryError`` naming the field,
    nothing changes) for a taken position or name, a bad type or labels."""
    spec = current_spec()
    if spec is None:
        raise InventoryError("load a topology before adding servers")
    check_position(spec, leaf, slot)
    check_node_name(node)
    try:
        kind = ServerType(
            gpu_type=check_type_slug(gpu_type or UNTYPED.gpu_type),
            labels=check_labels({} if labels is None else labels),
        )
    except ServerTypeError as exc:
        raise InventoryError(str(exc), exc.field) from None
    if Server.objects.filter(leaf=leaf, slot=slot).exists():
        raise InventoryError(f"leaf {leaf} slot {slot} already has a server")
    if Server.objects.filter(node=node).exists():
        raise InventoryError(f"node name {node!r} is already used")
    server = create_server_rows(spec, leaf, slot, node, kind)
    PendingServer.objects.filter(node=node).delete()
    audit.record(
        "server.add",
        obj=server,
        after={
            **audit.snapshot(server, SERVER_AUDIT_FIELDS),
            "gpus": spec.gpus_per_server,
            # what differs from an untyped server, as the topology document would say it
            **{k: v for k, v in kind.as_fields().items() if v != getattr(UNTYPED, k)},
        },
    )
    broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
    return server


@transaction.atomic
def do_remove_server(*, node: str) -> None:
    """Remove a server; refused while any job holds one of its GPUs."""
    server = Server.objects.select_for_update().filter(node=node).first()
    if server is None:
        raise InventoryError(f"no server named {node!r}")
    held = set(server.gpu_set.values_list("index", flat=True)) & _allocated_gpu_indices()
    if held:
        raise InventoryError(f"server {node} runs jobs on GPUs {sorted(held)}: drain it first")
    audit.record(
        "server.remove",
        obj=server,
        before={**audit.snapshot(server, SERVER_AUDIT_FIELDS), "gpus": server.gpu_set.count()},
    )
    server.delete()
    broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})


SERVER_AUDIT_FIELDS = ("node", "leaf", "slot", "state", "state_reason")
TYPE_AUDIT_FIELDS = ("gpu_type", "labels")


@transaction.atomic
def do_set_server_type(*, node: str, gpu_type: Any, labels: Any, user: Any = None) -> Server:
    """An admin sets a server's GPU type and labels (its pool among them).

    Refused (``InventoryError`` naming the field; nothing changes) for an unknown
    server (``node``), a bad type or labels, or a new type while a job holds one
    of its GPUs: a job never straddles types, so drain it first (labels may change
    under a running job: a selector chooses where jobs start).  A change is
    audited as ``server.retype``; the typed tick reads it through the change feed.
    """
    server = Server.objects.select_for_update().filter(node=node).first()
    if server is None:
        raise InventoryError(f"no server named {node!r}", "node")
    try:
        slug = check_type_slug(gpu_type or UNTYPED.gpu_type)
        checked = check_labels({} if labels is None else labels)
    except ServerTypeError as exc:
        raise InventoryError(str(exc), exc.field) from None
    if slug != server.gpu_type:
        held = set(server.gpu_set.values_list("index", flat=True)) & _allocated_gpu_indices()
        if held:
            raise InventoryConflict(
                f"server {node} runs jobs on GPUs {sorted(held)}: drain it before changing "
                "its GPU type (a job never straddles types)",
                "gpu_type",
            )
    if (slug, checked) == (server.gpu_type, server.labels):
        return server
    before = audit.snapshot(server, TYPE_AUDIT_FIELDS)
    server.gpu_type, server.labels = slug, checked
    server.save(update_fields=list(TYPE_AUDIT_FIELDS))
    audit.record(
        "server.retype",
        obj=server,
        user=user,
        before=before,
        after=audit.snapshot(server, TYPE_AUDIT_FIELDS),
    )
    broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
    return server


@transaction.atomic
def do_set_server_state(
    *, node: str, state: str, reason: str | None = None, user: Any = None
) -> Server:
    """Mark a server up, draining (jobs migrate off, nothing new lands) or down.

    The reason the server shows is ``reason``, else who did it ("drained by
    alice": ``user``, else the actor of ``audit.context``).  A change is audited
    as ``server.drain``, ``server.undrain`` or ``server.down``.
    """
    if state not in ServerState.values:
        raise InventoryError(f"unknown server state {state!r}")
    server = Server.objects.select_for_update().filter(node=node).first()
    if server is None:
        raise InventoryError(f"no server named {node!r}")
    if server.state != state:
        action, verb = STATE_ACTIONS[ServerState(state)]
        before = audit.snapshot(server, ("state", "state_reason"))
        server.state = state
        server.state_reason = (reason or f"{verb} by {current_actor(user).name}")[:200]
        server.save(update_fields=["state", "state_reason"])
        audit.record(
            action,
            obj=server,
            user=user,
            before=before,
            after=audit.snapshot(server, ("state", "state_reason")),
        )
        broadcast_on_commit(
            (CLUSTER_GROUP,),
            {"type": "server.state", "node": node, "state": state, "reason": server.state_reason},
        )
    return server


JOBS_SEEN = "jobs_seen"
"""Key of ``Server.agent_info``: job name → ISO time of the last heartbeat that listed it."""

BEAT_AT = "beat_at"
"""Key of ``Server.agent_info``: ISO time the newest heartbeat so far was sent."""

JOBS_SEEN_HORIZON = timedelta(hours=1)
"""Entries older than this are dropped: the map stays as small as the jobs lately on the node."""


def _parse_time(stamp: Any) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        at = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def beat_at(agent_info: Any) -> datetime | None:
    """When the server's newest heartbeat was sent (None for rows from before this was kept)."""
    return _parse_time(agent_info.get(BEAT_AT)) if isinstance(agent_info, Mapping) else None


UTC_STAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{6})?[+]00:00$"
"""The form of every ``beat_at`` that ``do_heartbeat`` writes (``isoformat`` of a UTC time).

Strings of this one form sort as the times they name, so the database's
``MAX`` of them is the latest time."""


@dataclass(frozen=True)
class Beats:
    """What one aggregate of every server's heartbeat says (read once by the tick).

    ``heard``: the newest arrival (``last_heartbeat``); ``newest``: the latest of every
    arrival and sent time (an upper bound of every server's beat); ``oldest_live``: the oldest arrival of
    an up or draining server (None: none has beaten), with which the silence check
    knows without another query that no server is silent.
    """

    heard: datetime | None
    newest: datetime | None
    oldest_live: datetime | None


def read_beats() -> Beats:
    """Every server's heartbeats in one aggregate query (:class:`Beats`).

    The sent times are compared as text, which is exact for the form
    ``do_heartbeat`` writes (``UTC_STAMP``); should any row hold another (a hand
    edit, a row from before), or the greatest not parse, every row is read and
    parsed instead, as :func:`beat_at` would.
    """
    heard, sent, odd, oldest_live = _beat_aggregate()
    latest = _parse_time(sent)
    if odd or (sent is not None and latest is None):
        beats = Server.objects.values_list("last_heartbeat", "agent_info")
        times = [t for heard, info in beats for t in (heard, beat_at(info)) if t is not None]
        newest = max(times, default=None)
    else:
        newest = max((t for t in (heard, latest) if t is not None), default=None)
    return Beats(heard=heard, newest=newest, oldest_live=oldest_live)


_LIVE_STATES = (ServerState.UP, ServerState.DRAINING)


def _beat_aggregate() -> tuple[datetime | None, str | None, int, datetime | None]:
    """The newest arrival, the greatest sent time (text), how many sent times are not
    ``UTC_STAMP``s, and the oldest arrival of a live server: one aggregate.

    On PostgreSQL (the tick's database, every few seconds) one constant statement
    through a plain cursor (:func:`_beat_sql`): the ORM compiled the aggregate again
    each call, most of this function's time.  Elsewhere the same aggregate by the ORM.
    """
    if connection.vendor != "postgresql":
        found = Server.objects.annotate(beat=KT(f"agent_info__{BEAT_AT}")).aggregate(
            heard=Max("last_heartbeat"),
            sent=Max("beat"),
            odd=Count("pk", filter=Q(beat__isnull=False) & ~Q(beat__regex=UTC_STAMP)),
            oldest_live=Min("last_heartbeat", filter=Q(state__in=_LIVE_STATES)),
        )
        return found["heard"], found["sent"], found["odd"], found["oldest_live"]
    with connection.cursor() as cursor:
        cursor.execute(
            _beat_sql(),
            {"key": BEAT_AT, "stamp": UTC_STAMP, "live": [str(s) for s in _LIVE_STATES]},
        )
        heard, sent, odd, oldest_live = cursor.fetchone()
    return heard, sent, odd, oldest_live


@functools.cache
def _beat_sql() -> str:
    """The ORM's aggregate of :func:`_beat_aggregate`, written once (PostgreSQL).

    Parameters: the key of the sent time, ``UTC_STAMP``, the live states.
    """
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        field = Server._meta.get_field(name)
        assert isinstance(field, Field) and field.column  # every one a column
        return quote(field.column)

    key, heard, info, state = map(column, ("id", "last_heartbeat", "agent_info", "state"))
    beat = f"({info} ->> %(key)s)"
    return (
        f"SELECT MAX({heard}), MAX({beat}), "
        f"COUNT({key}) FILTER (WHERE {beat} IS NOT NULL AND NOT ({beat} ~ %(stamp)s)), "
        f"MIN({heard}) FILTER (WHERE {state} = ANY(%(live)s)) "
        f"FROM {quote(Server._meta.db_table)}"
    )


def sent_at(info: Mapping[str, Any], received: datetime) -> datetime:
    """A heartbeat's own time: when the agent sent it, never later than its arrival.

    A report that waited in a backlog keeps the time it was sent, so it does not
    look like news; an agent's clock that runs ahead cannot push it later.
    """
    raw = info.get("at")
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return received
    try:
        sent = datetime.fromtimestamp(raw, tz=UTC)
    except (ValueError, OverflowError, OSError):  # nan, inf, out of range
        return received
    return min(sent, received)


def jobs_seen(agent_info: Any) -> dict[str, datetime]:
    """When each job was last listed by the server's heartbeats (read by the tick's reconcile).

    Tolerates anything in ``agent_info`` (older rows, hand edits): what does not
    parse is left out.
    """
    raw = agent_info.get(JOBS_SEEN) if isinstance(agent_info, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    seen: dict[str, datetime] = {}
    for job, stamp in raw.items():
        at = _parse_time(stamp)
        if isinstance(job, str) and at is not None:
            seen[job] = at
    return seen


def listed_jobs(info: Mapping[str, Any]) -> set[str]:
    """The jobs that a heartbeat's ``workers`` list runs (the protocol checked its shape)."""
    workers = info.get("workers")
    if not isinstance(workers, list | tuple):
        return set()
    return {w["job"] for w in workers if isinstance(w, Mapping) and isinstance(w.get("job"), str)}


def _merge_seen(previous: Any, listed: set[str], at: datetime) -> dict[str, str]:
    """The previous map with ``listed`` seen at ``at`` (reports may arrive out of order)."""
    seen = {
        job: stamp for job, stamp in jobs_seen(previous).items() if at - stamp < JOBS_SEEN_HORIZON
    }
    for job in listed:
        seen[job] = max(at, seen.get(job, at))
    return {job: stamp.isoformat() for job, stamp in seen.items()}


def do_heartbeat(*, node: str, info: Mapping[str, Any], at: datetime | None = None) -> bool:
    """Record an agent's heartbeat (``apply_heartbeat``); False for an unknown node."""
    return apply_heartbeat(node=node, info=info, at=at) is not None


@dataclass(frozen=True)
class BeatApplied:
    """A known node's heartbeat, recorded: the hardware its previous heartbeat reported."""

    previous_hardware: Any


@transaction.atomic
def apply_heartbeat(
    *, node: str, info: Mapping[str, Any], at: datetime | None = None
) -> BeatApplied | None:
    """Record an agent's heartbeat; a server marked down by missed beats comes back up.

    Besides the heartbeat itself, remembers when each job was last listed with
    running workers (``jobs_seen``) and when the newest heartbeat was sent
    (``beat_at``), both in the agent's own sending time (``sent_at``), so the
    tick can tell a job with no process (``control.reconcile``).
    None for an unknown node (the report is ignored, nothing changes); else what the
    previous heartbeat reported of the hardware (the caller compares health).
    """
    server = Server.objects.select_for_update().filter(node=node).first()
    if server is None:
        return None
    now = at or timezone.now()
    previous = server.agent_info
    sent = sent_at(info, now)
    newest = max(sent, beat_at(previous) or sent)
    server.last_heartbeat = now
    server.agent_info = {
        **info,
        JOBS_SEEN: _merge_seen(previous, listed_jobs(info), sent),
        BEAT_AT: newest.isoformat(),
    }
    fields = ["last_heartbeat", "agent_info"]
    if server.state == ServerState.DOWN and server.state_reason == MISSED_HEARTBEATS:
        server.state = ServerState.UP
        server.state_reason = "heartbeats resumed"
        fields += ["state", "state_reason"]
        broadcast_on_commit(
            (CLUSTER_GROUP,),
            {"type": "server.state", "node": node, "state": "up", "reason": server.state_reason},
        )
    server.save(update_fields=fields)
    return BeatApplied(previous.get("hardware") if isinstance(previous, dict) else None)


STALL_FACTOR = 10
"""How many down-after intervals a stalled report pipeline may hold every server up."""


def pipeline_stalled(
    *, now: datetime, newest: datetime | None, after_seconds: float, stall_factor: float
) -> bool:
    """Whether no heartbeat at all arrived for ``stall_factor`` down-after intervals (pure).

    Then every agent really is gone (or never came): silence is measured up to now.
    """
    return newest is None or now - newest >= timedelta(seconds=after_seconds * stall_factor)


def silence_cutoff(
    *, now: datetime, newest: datetime | None, after_seconds: float, stall_factor: float
) -> datetime:
    """Servers whose last heartbeat arrived before this are silent (pure).

    Heartbeats reach the control plane as reports, through the report queue and
    its Celery worker. When that pipeline stops (the worker restarting, a
    backlog), *every* server's heartbeats stop arriving at once, although the
    agents are fine: marking them all down would requeue jobs that still train.
    So silence is measured up to the newest heartbeat that arrived from any
    server, not up to now: one dead agent among live ones is still caught after
    ``after_seconds``, and a stalled pipeline marks nobody down. Should no
    heartbeat at all arrive for ``stall_factor`` times that (every agent really
    gone), silence is measured up to now again.
    """
    reference = now
    if not pipeline_stalled(
        now=now, newest=newest, after_seconds=after_seconds, stall_factor=stall_factor
    ):
        assert newest is not None
        reference = min(now, newest)
    return reference - timedelta(seconds=after_seconds)


def still_queued(
    candidates: Mapping[str, datetime | None], newest_sent: datetime | None, after_seconds: float
) -> set[str]:
    """The silent-looking servers whose heartbeats may only be waiting in the backlog (pure).

    ``candidates`` maps each server that no heartbeat reached for too long to when
    its newest heartbeat was *sent* (``beat_at``); ``newest_sent`` is the newest
    such time of any server. When the report worker comes back from a stall, it
    drains the backlog in order: the first heartbeats it applies are fresh
    arrivals, while the other servers' heartbeats of the same moments are still
    queued behind them, so silence by arrival alone marks live servers down. The
    pipeline has delivered everything sent up to ``newest_sent``, so a server is
    silent only when its own newest heartbeat was sent more than
    ``after_seconds`` before that. Sent times are clamped to their arrival
    (``sent_at``), so an agent's clock can only spare a server here, never mark
    one down that arrival alone would not.
    """
    if newest_sent is None:
        return set()
    horizon = newest_sent - timedelta(seconds=after_seconds)
    return {node for node, sent in candidates.items() if sent is not None and sent >= horizon}


def do_mark_silent_servers_down(
    *,
    now: datetime,
    after_seconds: float,
    stall_factor: float = STALL_FACTOR,
    beats: Beats | None = None,
) -> list[str]:
    """Mark down every up/draining server whose agent has been silent too long.

    Silence is judged against the newest heartbeat of any server (``silence_cutoff``),
    so a stalled report pipeline does not look like every agent dying, and, while
    heartbeats arrive, by when they were sent (``still_queued``), so a backlog being
    drained does not either.

    ``beats``: the servers' heartbeats as :func:`read_beats` read them in this
    transaction (the tick reads them once for this and its reconcile); read here
    when not given.  When they show every up or draining server heard from since
    the cutoff, no server is silent and none is read (heartbeats only move forward).
    """
    beats = beats or read_beats()
    newest = beats.heard
    cutoff = silence_cutoff(
        now=now, newest=newest, after_seconds=after_seconds, stall_factor=stall_factor
    )
    if beats.oldest_live is None or beats.oldest_live >= cutoff:
        return []  # every up or draining server beat since the cutoff, or none ever did
    with transaction.atomic():  # only now: a savepoint is two round trips in the tick
        silent = Server.objects.select_for_update().filter(
            state__in=(ServerState.UP, ServerState.DRAINING), last_heartbeat__lt=cutoff
        )
        candidates = {
            node: beat_at(info) for node, info in silent.values_list("node", "agent_info")
        }
        if candidates and not pipeline_stalled(
            now=now, newest=newest, after_seconds=after_seconds, stall_factor=stall_factor
        ):
            sent = [
                _parse_time(raw)
                for raw in Server.objects.values_list(f"agent_info__{BEAT_AT}", flat=True)
            ]
            newest_sent = max((at for at in sent if at is not None), default=None)
            for node in still_queued(candidates, newest_sent, after_seconds):
                del candidates[node]
        nodes = sorted(candidates)
        if nodes:
            Server.objects.filter(node__in=nodes).update(
                state=ServerState.DOWN, state_reason=MISSED_HEARTBEATS
            )
            for node in nodes:
                broadcast_on_commit(
                    (CLUSTER_GROUP,),
                    {"type": "server.state", "node": node, "state": "down"}
                    | {"reason": MISSED_HEARTBEATS},
                )
        return nodes


SUSPECT_AUDIT_FIELDS = (
    "suspect_until",
    "suspect_since",
    "suspect_reason",
    "suspect_by",
    "suspect_job",
)
SUSPECT_REASON_MAX = 200


@dataclass(frozen=True)
class SuspectGpu:
    """A GPU marked suspect and still in its cool-down: where it is, why, until when, whose job."""

    index: int
    node: str
    local: int
    since: datetime | None
    until: datetime
    reason: str
    by: str
    job_id: int | None

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the cluster view, the API)."""
        return {
            "gpu": self.index,
            "node": self.node,
            "local": self.local,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat(),
            "reason": self.reason,
            "by": self.by,
            "job": self.job_id,
        }


def suspect_in_effect() -> Any:
    """The GPUs whose suspect mark has not lapsed, as a queryset.

    Compared with the database's clock: on PostgreSQL ``now()`` is the
    transaction's start, so every read of one tick (the kept state and its
    verify rebuild) sees the same marks, and a mark lapses with no write.
    """
    return Gpu.objects.filter(suspect_until__gt=Now())


def suspect_gpus() -> list[SuspectGpu]:
    """Every GPU in its cool-down, by index (one query)."""
    rows = (
        suspect_in_effect()
        .order_by("index")
        .values_list(
            "index",
            "server__node",
            "local",
            "suspect_since",
            "suspect_until",
            "suspect_reason",
            "suspect_by",
            "suspect_job",
            named=True,
        )
    )
    return [
        SuspectGpu(
            index=row.index,
            node=row.server__node,
            local=row.local,
            since=row.suspect_since,
            until=row.suspect_until,
            reason=row.suspect_reason,
            by=row.suspect_by,
            job_id=row.suspect_job,
        )
        for row in rows
    ]


def _suspect_changed(gpu: Gpu) -> None:
    broadcast_on_commit(
        (CLUSTER_GROUP,),
        {"type": "gpu.suspect", "gpu": gpu.index, "until": plain_time(gpu.suspect_until)},
    )


def plain_time(at: datetime | None) -> str | None:
    """An aware time as ISO text (None stays None)."""
    return at.isoformat() if at is not None else None


@transaction.atomic
def do_mark_gpu_suspect(
    *, gpu: int, at: datetime, seconds: float, reason: str, job_id: int | None, by: str
) -> Gpu | None:
    """Mark GPU ``gpu`` suspect from ``at`` for ``seconds`` (the control plane's own action).

    New placements and scale-outs avoid it until then; a job already on it keeps
    it.  A mark still in effect is extended, never shortened.  Nothing happens
    (None) for an unknown GPU, ``seconds <= 0`` (``STRAGGLER_COOLDOWN_SECONDS=0``),
    or a cool-down that has already ended (a report that waited in a backlog).
    Not audited: it is the system's, like marking silent servers down; the job's
    history says what happened.
    """
    if not seconds > 0:
        return None
    until = at + timedelta(seconds=seconds)
    if until <= timezone.now():
        return None
    row = Gpu.objects.select_for_update().filter(index=gpu).first()
    if row is None:
        return None
    if row.suspect_until is not None and row.suspect_until > until:
        until = row.suspect_until
    row.suspect_until = until
    row.suspect_since = at
    row.suspect_reason = reason[:SUSPECT_REASON_MAX]
    row.suspect_by = by[:150]
    row.suspect_job = job_id
    row.save(update_fields=list(SUSPECT_AUDIT_FIELDS))
    _suspect_changed(row)
    return row


@transaction.atomic
def do_clear_gpu_suspect(*, gpu: int, user: Any = None) -> Gpu:
    """An admin returns a suspect GPU to service before its cool-down ends (audited).

    Refused (``InventoryError``, nothing changes) for an unknown GPU or one that
    is not suspect now.  Audited as ``gpu.clear_suspect`` with the mark before.
    """
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise InventoryError("a GPU is named by its integer index")
    row = Gpu.objects.select_for_update().select_related("server").filter(index=gpu).first()
    if row is None:
        raise InventoryError(f"no GPU {gpu}")
    if not suspect_in_effect().filter(pk=row.pk).exists():
        raise InventoryError(f"GPU {gpu} is not suspect")
    before = audit.snapshot(row, SUSPECT_AUDIT_FIELDS)
    row.suspect_until = None
    row.suspect_since = None
    row.suspect_reason = ""
    row.suspect_by = ""
    row.suspect_job = None
    row.save(update_fields=list(SUSPECT_AUDIT_FIELDS))
    audit.record(
        "gpu.clear_suspect",
        obj=row,
        user=user,
        before=before,
        after=audit.snapshot(row, SUSPECT_AUDIT_FIELDS),
    )
    _suspect_changed(row)
    return row
