"""One row per change: the audit log (append-only).

Rows name their actor and tenant by id *and* by name, with no foreign keys:
deleting a user or a tenant neither touches nor loses the record of what they did.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models


class AppendOnlyError(RuntimeError):
    """An attempt to change or delete an audit row."""


def _refuse(what: str) -> NoReturn:
    raise AppendOnlyError(f"the audit log is append-only: {what} is not allowed")


class AuditQuerySet(models.QuerySet["AuditEntry"]):
    """Reads only: bulk updates and deletes are refused."""

    def update(self, **kwargs: Any) -> int:
        """Refused: audit rows never change."""
        _refuse("update()")

    def delete(self) -> tuple[int, dict[str, int]]:
        """Refused: audit rows are never deleted."""
        _refuse("delete()")

    def for_tenants(self, tenant_ids: list[int]) -> AuditQuerySet:
        """Rows about the tenants ``tenant_ids`` (a tenant owner's view)."""
        return self.filter(tenant_id__in=tenant_ids)


class AuditEntry(models.Model):
    """One change: actor, how they signed in, tenant, action, object, before/after, address, time."""

    at = models.DateTimeField(db_index=True)
    actor_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    actor_name = models.CharField(max_length=150)
    via = models.CharField(
        max_length=100, help_text="How the actor was authenticated: session, token <name>, …"
    )
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    tenant_slug = models.CharField(max_length=50, blank=True, default="")
    action = models.CharField(max_length=50, db_index=True)
    object_type = models.CharField(max_length=100, blank=True, default="")
    object_id = models.CharField(max_length=64, blank=True, default="")
    object_repr = models.CharField(max_length=200, blank=True, default="")
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    client_address = models.GenericIPAddressField(null=True, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["tenant_id", "-at"], name="audit_tenant_at")]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.object_type} {self.object_id} at {self.at}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Insert once; a second save of the same row is refused."""
        if not self._state.adding:
            _refuse("changing a row")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Refused: audit rows are never deleted."""
        _refuse("deleting a row")
