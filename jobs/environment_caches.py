"""The nodes' environment caches as the control plane knows them, and admins' evictions.

::

    agent ──environment_cache──▶ do_record_cache_report   the node's rows replaced whole
    admin ──evict (page / API)─▶ do_request_eviction      a row, an audit entry, and on commit
                                                           evict_environment ──▶ agent.<node>
    agent ──environment_evicted─▶ do_record_eviction_result  the answer on its row, audited;
                                                           an evicted entry leaves the listing

Agents are trusted with their own node only: a report is applied only when
its envelope was signed by the node it names (``control.reports``), and
an answer only for a command that was sent to that node.  The reports hold
no tenant's name: keys, packages and sizes, for cluster admins alone.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from audit import services as audit
from inventory.models import Server
from jobs.models import (
    CachedEnvironment,
    EnvironmentEviction,
    EvictionOutcome,
    NodeEnvironmentCache,
)
from jobs.outbox import publish
from workers.protocol import (
    ENVIRONMENT_KEY,
    EnvironmentCacheReport,
    EnvironmentEvicted,
    EvictEnvironment,
)

RECENT_EVICTIONS = 20
"""How many evictions the admin page and the API list (the latest first)."""


class EvictionError(ValueError):
    """An eviction that cannot be asked for as given; nothing was sent or recorded."""


def _moment(unix: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(unix, tz=dt.UTC)


@transaction.atomic
def do_record_cache_report(report: EnvironmentCacheReport) -> str:
    """Keep ``report`` as its node's latest (its rows replaced whole); a short outcome.

    ``unknown node`` for a node the inventory lacks, ``stale`` for a report no
    newer than the one kept (reports may arrive out of order): neither changes anything.
    """
    server = Server.objects.select_for_update().filter(node=report.node).first()
    if server is None:
        return "unknown node"
    at = _moment(report.at)
    cache = NodeEnvironmentCache.objects.filter(server=server).first()
    if cache is not None and cache.reported_at >= at:
        return "stale"
    if cache is None:
        cache = NodeEnvironmentCache(server=server)
    cache.reported_at = at
    cache.max_bytes = report.max_bytes
    cache.total_bytes = report.total_bytes
    cache.omitted = report.omitted
    cache.save()
    cache.entries.all().delete()
    CachedEnvironment.objects.bulk_create(
        CachedEnvironment(
            cache=cache,
            key=entry.key,
            size_bytes=entry.size_bytes,
            last_used_at=_moment(entry.last_used),
            in_use=entry.in_use,
            packages=list(entry.packages),
            requirements=list(entry.requirements),
            packages_omitted=entry.packages_omitted,
            built_at=None if entry.built_at is None else _moment(entry.built_at),
            build_s=entry.build_s,
        )
        for entry in report.entries
    )
    return "environment cache"


@transaction.atomic
def do_request_eviction(*, node: str, key: str, user: Any = None) -> EnvironmentEviction:
    """Ask the agent of ``node`` to evict environment ``key`` (audited as ``environment.evict``).

    The command goes out once the request commits; the agent's answer comes back
    as ``environment_evicted`` (``do_record_eviction_result``).  Refused
    (``EvictionError``) for a malformed key or an unknown node.
    """
    if not isinstance(key, str) or not ENVIRONMENT_KEY.fullmatch(key):
        raise EvictionError("an environment key is 32 hexadecimal digits")
    server = Server.objects.filter(node=node).first() if isinstance(node, str) else None
    if server is None:
        raise EvictionError(f"no server {node!r}")
    command = EvictEnvironment(command_id=f"evict-{uuid.uuid4().hex}", key=key)
    eviction = EnvironmentEviction.objects.create(
        server=server,
        key=key,
        command_id=command.command_id,
        requested_by=user if getattr(user, "is_authenticated", False) else None,
        requested_at=timezone.now(),
    )
    audit.record(
        "environment.evict",
        obj=eviction,
        user=user,
        object_repr=f"environment {key} on {server.node}",
        after={"node": server.node, "key": key, "command_id": command.command_id},
    )
    transaction.on_commit(functools.partial(publish, [(server.node, command)]))
    return eviction


@transaction.atomic
def do_record_eviction_result(report: EnvironmentEvicted) -> str:
    """Put an agent's answer on its eviction (audited as ``environment.evicted``).

    Only the node the command went to may answer it, once, for the key it
    named: anything else is ``unknown eviction`` or ``duplicate`` and changes
    nothing.  A key evicted, or not found, leaves the node's listing at once.
    """
    eviction = (
        EnvironmentEviction.objects.select_for_update()
        .select_related("server")
        .filter(command_id=report.command_id, server__node=report.node, key=report.key)
        .first()
    )
    if eviction is None:
        return "unknown eviction"
    if eviction.outcome != EvictionOutcome.PENDING:
        return "duplicate"
    eviction.outcome = report.outcome
    eviction.detail = report.detail
    eviction.answered_at = timezone.now()
    eviction.save(update_fields=["outcome", "detail", "answered_at"])
    if report.outcome in ("evicted", "not_found"):  # gone, or the listing was out of date
        CachedEnvironment.objects.filter(cache__server=eviction.server, key=report.key).delete()
    audit.record(
        "environment.evicted",
        obj=eviction,
        object_repr=f"environment {report.key} on {report.node}",
        before={"outcome": EvictionOutcome.PENDING},
        after={"outcome": report.outcome, "detail": report.detail},
    )
    return f"eviction {report.outcome}"


@dataclass(frozen=True)
class NodeCache:
    """One server's environment cache as last reported (``cache`` None: never reported)."""

    node: str
    cache: NodeEnvironmentCache | None
    entries: tuple[CachedEnvironment, ...]

    @property
    def over_cap(self) -> bool:
        """Whether the cache holds more than its cap (the agent's next clean pass evicts)."""
        return self.cache is not None and self.cache.total_bytes > self.cache.max_bytes


def node_caches() -> list[NodeCache]:
    """Every server's latest cache report, entries most recently used first (three queries)."""
    servers = Server.objects.order_by("node").prefetch_related(
        Prefetch(
            "environment_cache__entries",
            queryset=CachedEnvironment.objects.order_by("-last_used_at", "key"),
        )
    )
    out = []
    for server in servers:
        cache = getattr(server, "environment_cache", None)
        entries = tuple(cache.entries.all()) if cache is not None else ()
        out.append(NodeCache(node=server.node, cache=cache, entries=entries))
    return out


def recent_evictions(limit: int = RECENT_EVICTIONS) -> list[EnvironmentEviction]:
    """The latest evictions asked for, with their answers (latest first)."""
    return list(
        EnvironmentEviction.objects.select_related("server", "requested_by").order_by(
            "-requested_at", "-id"
        )[:limit]
    )
