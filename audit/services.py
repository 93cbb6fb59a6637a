"""The one writer of the audit log: :func:`record`, called by the service that makes a change.

It must run inside the change's own transaction (``transaction.atomic``): the
row and the change commit together or not at all, so a change without its row
cannot happen, and a failed change leaves no row.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from django.db import models, transaction
from django.utils import timezone

from audit.context import current_actor
from audit.models import AuditEntry

REPR_MAX = 200


class AuditError(RuntimeError):
    """An audit row that cannot be written as asked (outside a transaction)."""


class TenantLike(Protocol):
    """What the log keeps of a tenant: its id and slug (audit sits below ``tenancy``)."""

    pk: Any
    slug: str


def plain(value: Any) -> Any:
    """``value`` as JSON: dates as ISO text, decimals and UUIDs as text, models as their pk."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def snapshot(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    """The named fields of ``obj`` as JSON (foreign keys by id: use ``<name>_id``)."""
    return {name: plain(getattr(obj, name)) for name in fields}


def changed(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Only the fields whose value differs, before and after."""
    keys = [k for k in after if before.get(k) != after.get(k)]
    return {k: before.get(k) for k in keys}, {k: after[k] for k in keys}


def record(
    action: str,
    *,
    obj: models.Model | None = None,
    tenant: TenantLike | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    user: Any = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
) -> AuditEntry:
    """Write one audit row for ``action`` (e.g. ``"job.cancel"``) on ``obj`` in ``tenant``.

    ``user`` is the service's caller when it knows one; how they signed in and from
    where come from ``audit.context``.  Objects that are not rows (a server of the
    topology) are named by ``object_type``/``object_id``/``object_repr`` instead.
    """
    if not transaction.get_connection().in_atomic_block:
        raise AuditError(f"audit.record({action!r}) must run inside the change's transaction")
    actor = current_actor(user)
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or str(obj.pk)
        object_repr = object_repr or str(obj)
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor_id=actor.user_id,
        actor_name=actor.name[:150],
        via=actor.via[:100],
        tenant_id=None if tenant is None else int(tenant.pk),
        tenant_slug="" if tenant is None else tenant.slug,
        action=action,
        object_type=object_type[:100],
        object_id=object_id[:64],
        object_repr=object_repr[:REPR_MAX],
        before=plain(dict(before or {})),
        after=plain(dict(after or {})),
        client_address=actor.address,
    )
