"""Servers that register themselves: an agent's hardware report against the inventory.

Every heartbeat may carry the node's hardware (``workers.protocol.Hardware``)::

    heartbeat(node, hardware)
      ├─ node unknown ─────────→ PendingServer row (no position, no GPU rows:
      │                          never scheduled) until an admin accepts it
      │                          onto a leaf: do_accept_server → Server + GPUs
      └─ node known
           ├─ report differs ──→ an up server is drained, its reason says how
           │  (GPU gone, model,   ("hardware differs: 7 GPUs reported, 8 expected")
           │   count)
           ├─ matches ─────────→ what the row did not know is learned (model,
           │                     memory, UUIDs, CPU cores, host memory)
           └─ a GPU unhealthy ─→ marked suspect as a straggler's GPU is
              (ECC, too hot)      (``services.do_mark_gpu_suspect``): the tick
                                  gives it to nothing new until the mark lapses

Reports are signed by their node's key (``jobs.agent_trust``) and may speak
only for that node (``control.reports``); their sizes and types are checked
by the protocol before they get here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import services as audit
from inventory import services
from inventory.hardware import (
    DIFFERS_PREFIX,
    NOT_REPORTED,
    HealthLimits,
    ServerFacts,
    differences,
    host_figures,
    learned,
    reported_gpus,
    unhealthy_gpus,
)
from inventory.models import Gpu, PendingServer, Server, ServerState
from inventory.server_types import (
    DEFAULT_GPU_TYPE,
    ServerType,
    ServerTypeError,
    check_labels,
    check_type_slug,
)
from utilities.realtime import CLUSTER_GROUP, broadcast_on_commit

log = logging.getLogger(__name__)

MAX_PENDING_SERVERS = 256
"""Unknown nodes remembered at once: a flood of names cannot grow the table without end."""
HEALTH_MARK_BY = "gpu health"


def health_limits() -> HealthLimits:
    """The thresholds that take a GPU out of service (``GPU_HEALTH_*`` settings)."""
    return HealthLimits(
        max_ecc_uncorrected=int(getattr(settings, "GPU_HEALTH_MAX_ECC_UNCORRECTED", 0)),
        max_temperature_c=float(getattr(settings, "GPU_HEALTH_MAX_TEMPERATURE_C", 90.0)),
    )


def health_hold_seconds() -> float:
    """How long an unhealthy GPU stays out of service after its last bad report."""
    return float(getattr(settings, "GPU_HEALTH_HOLD_SECONDS", 600.0))


@transaction.atomic
def do_heartbeat(*, node: str, info: Mapping[str, Any], at: datetime | None = None) -> bool:
    """Record a heartbeat (``services.apply_heartbeat``) and read its hardware report.

    A known node's report is checked against its row; an unknown node becomes
    (or stays) pending.  Returns whether the node is known.
    """
    now = at or timezone.now()
    beat = services.apply_heartbeat(node=node, info=info, at=now)
    hardware = info.get("hardware")
    if beat is not None:
        check_reported_hardware(node=node, hardware=hardware, at=now)
        word = health_word(hardware)
        if word != health_word(beat.previous_hardware):  # the views' health column follows
            broadcast_on_commit(
                (CLUSTER_GROUP,), {"type": "server.health", "node": node, "health": word}
            )
    else:
        do_record_pending(node=node, hardware=hardware, at=now)
    return beat is not None


def health_word(hardware: Any) -> str:
    """A server's health in a word: ``ok``, ``unhealthy`` or ``not reported`` (no NVML)."""
    if not isinstance(hardware, Mapping) or hardware.get("health") != "nvml":
        return NOT_REPORTED
    return "unhealthy" if unhealthy_gpus(hardware, health_limits()) else "ok"


def server_facts(server: Server) -> ServerFacts:
    """What the inventory holds of ``server`` that a report can contradict."""
    uuids = tuple(server.gpu_set.order_by("local").values_list("uuid", flat=True))
    return ServerFacts(gpu_count=server.gpu_count, gpu_model=server.gpu_model, uuids=uuids)


def check_reported_hardware(*, node: str, hardware: Any, at: datetime) -> None:
    """Drain a server whose report differs from its row; else learn from it; judge health."""
    server = Server.objects.select_for_update().filter(node=node).first()
    if server is None or not isinstance(hardware, Mapping):
        return
    facts = server_facts(server)
    found = differences(facts, hardware)
    if found:
        if server.state == ServerState.UP:
            reason = (DIFFERS_PREFIX + "; ".join(found))[:200]
            log.warning("server %s drained: %s", node, reason)
            services.do_set_server_state(node=node, state=ServerState.DRAINING, reason=reason)
        return
    _learn(server, facts, hardware)
    _mark_unhealthy(server, hardware, at)


def _learn(server: Server, facts: ServerFacts, hardware: Mapping[str, Any]) -> None:
    news = learned(facts, hardware)
    uuids = news.pop("uuids", ())
    news |= {k: v for k, v in host_figures(hardware).items() if not getattr(server, k)}
    if news:
        for name, value in news.items():
            setattr(server, name, value)
        server.save(update_fields=list(news))
    for local, uuid in enumerate(uuids):
        Gpu.objects.filter(server=server, local=local).update(uuid=uuid[:96])


def _mark_unhealthy(server: Server, hardware: Mapping[str, Any], at: datetime) -> None:
    bad = unhealthy_gpus(hardware, health_limits())
    if not bad:
        return
    index_of = dict(server.gpu_set.values_list("local", "index"))
    for local, reason in bad:
        if local in index_of:
            services.do_mark_gpu_suspect(
                gpu=index_of[local],
                at=at,
                seconds=health_hold_seconds(),
                reason=f"unhealthy: {reason}",
                job_id=None,
                by=HEALTH_MARK_BY,
            )


def do_record_pending(*, node: str, hardware: Any, at: datetime) -> PendingServer | None:
    """Remember an unknown node that reported itself, for an admin to accept (or not).

    A forgotten node's row that was hidden comes back (its row says it was
    forgotten).  None when the table is full (``MAX_PENDING_SERVERS``) even after
    dropping the longest-forgotten hidden row: the report is dropped.
    """
    row = PendingServer.objects.select_for_update().filter(node=node).first()
    kept = dict(hardware) if isinstance(hardware, Mapping) else {}
    if row is None:
        if PendingServer.objects.count() >= MAX_PENDING_SERVERS and not _drop_one_hidden():
            log.warning("pending servers are full: %s not recorded", node)
            return None
        try:
            with transaction.atomic():  # two first reports at once: the second one updates
                row = PendingServer.objects.create(
                    node=node, hardware=kept, first_seen=at, last_seen=at
                )
        except IntegrityError:
            row = PendingServer.objects.select_for_update().get(node=node)
        else:
            broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
            return row
    back = row.hidden and at > (row.forgotten_at or at)
    row.hardware, row.last_seen = kept, max(at, row.last_seen)
    row.save(update_fields=["hardware", "last_seen"])
    if back:  # a forgotten node reports again: its row reappears, saying so
        log.info("forgotten server %s reported again: pending again", node)
        broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
    return row


def _drop_one_hidden() -> bool:
    """Make room: delete the longest-forgotten row that stayed silent; False if none."""
    hidden = PendingServer.objects.exclude(pk__in=PendingServer.listed().values("pk"))
    oldest = hidden.order_by("forgotten_at", "pk").first()
    if oldest is None:
        return False
    oldest.delete()
    return True


def listed_pending(pending: Any) -> PendingServer:
    """The listed pending server ``pending`` (by id), locked; ``InventoryError`` if none.

    A hidden (forgotten, silent) row is as missing as one that never was.
    """
    if isinstance(pending, bool) or not isinstance(pending, int):
        raise services.InventoryError("a pending server is named by its integer id", "pending")
    row = PendingServer.listed().select_for_update().filter(pk=pending).first()
    if row is None:
        raise services.InventoryError(f"no pending server {pending}", "pending")
    return row


PENDING_AUDIT_FIELDS = ("node", "first_seen", "last_seen", "forgotten_at", "forgotten_by")


def _actor_name(user: Any) -> str:
    name = getattr(user, "get_username", None)
    return str(name() if callable(name) else "")[:150]


@transaction.atomic
def do_forget_pending_server(*, pending: Any, user: Any = None, at: datetime | None = None) -> None:
    """An admin forgets a pending server: it leaves the list, nothing is scheduled on it.

    Refused (``InventoryError``, nothing changes) for an id that is not listed.
    The row is kept hidden: the node's next report brings it back, marked as
    forgotten before (an agent still running cannot be forgotten for good from
    here; stop it on its machine).  Audited as ``server.forget``.
    """
    row = listed_pending(pending)
    before = audit.snapshot(row, PENDING_AUDIT_FIELDS)
    row.forgotten_at = max(at or timezone.now(), row.last_seen)
    row.forgotten_by = _actor_name(user)
    row.save(update_fields=["forgotten_at", "forgotten_by"])
    audit.record(
        "server.forget",
        obj=row,
        user=user,
        before=before,
        after=audit.snapshot(row, PENDING_AUDIT_FIELDS),
    )
    broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})


def count_refusal(node: str, reported: int, per_server: int) -> str:
    """Why a server of another GPU count cannot join: the fabric holds one count per server.

    The vClos fabric (``fabric.topology.FabricSpec``) numbers GPUs by leaf, slot
    and a single ``gpus_per_server``; servers of different sizes in one fabric
    are not supported (docs/fabric.md, "Limits of typed servers").
    """
    return (
        f"{node} reports {reported} GPUs but every server of this fabric has {per_server} "
        f"(gpus_per_server): one fabric holds servers of one GPU count only"
    )


def _free_slot(leaf: int, servers_per_leaf: int) -> int:
    taken = set(Server.objects.filter(leaf=leaf).values_list("slot", flat=True))
    free = [slot for slot in range(servers_per_leaf) if slot not in taken]
    if not free:
        raise services.InventoryError(f"leaf {leaf} has no free slot", "leaf")
    return free[0]


def accepted_type(hardware: Any, gpu_type: Any, labels: Any) -> ServerType:
    """What an accepted server is: its report's model and figures, the admin's type and labels."""
    try:
        slug = check_type_slug(DEFAULT_GPU_TYPE if gpu_type in (None, "") else gpu_type)
        checked = check_labels({} if labels is None else labels)
    except ServerTypeError as exc:
        raise services.InventoryError(str(exc), exc.field) from None
    first = (reported_gpus(hardware) or [{}])[0]
    host = host_figures(hardware)
    return ServerType(
        gpu_type=slug,
        gpu_model=str(first.get("model", ""))[:96],
        gpu_memory_mib=int(first.get("memory_mib", 0)),
        cpu_cores=host.get("cpu_cores", 0),
        memory_mib=host.get("memory_mib", 0),
        labels=checked,
    )


@transaction.atomic
def do_accept_server(
    *,
    pending: int,
    leaf: Any,
    slot: Any = None,
    gpu_type: Any = None,
    labels: Any = None,
    user: Any = None,
) -> Server:
    """An admin accepts a pending server onto ``leaf`` (its first free slot, or ``slot``).

    Refused (``InventoryError`` naming the field; nothing changes) for a
    position outside the fabric or taken, a bad type or labels, or a report
    whose GPU count is not the fabric's per-server count.  Audited as
    ``server.accept``.
    """
    row = listed_pending(pending)
    spec = services.current_spec()
    if spec is None:
        raise services.InventoryError("load a topology before accepting servers", "leaf")
    services.check_position(spec, leaf, 0 if slot is None else slot)
    place = _free_slot(leaf, spec.servers_per_leaf) if slot is None else slot
    if Server.objects.filter(leaf=leaf, slot=place).exists():
        raise services.InventoryError(f"leaf {leaf} slot {place} already has a server", "slot")
    gpus = reported_gpus(row.hardware)
    if gpus is not None and len(gpus) != spec.gpus_per_server:
        raise services.InventoryError(
            count_refusal(row.node, len(gpus), spec.gpus_per_server), "pending"
        )
    kind = accepted_type(row.hardware, gpu_type, labels)
    uuids = tuple(str(g.get("uuid", "")) for g in gpus or ())
    server = services.create_server_rows(spec, leaf, place, row.node, kind, uuids)
    row.delete()
    audit.record(
        "server.accept",
        obj=server,
        user=user,
        after={**audit.snapshot(server, services.SERVER_AUDIT_FIELDS), "gpu_type": kind.gpu_type},
    )
    broadcast_on_commit((CLUSTER_GROUP,), {"type": "topology.changed"})
    return server
