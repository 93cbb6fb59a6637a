"""A shell opened into a running job's worker: who, when, where, and how it ended."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from jobs.models import Job
from tenancy.models import Tenant, TenantOwnedQuerySet


class ShellQuerySet(TenantOwnedQuerySet):
    """Queries over shells; ``restrict(user)`` scopes them to the user's tenants."""

    def open(self) -> ShellQuerySet:
        """Shells not yet closed."""
        return self.filter(closed_at__isnull=True)


class Shell(models.Model):
    """One interactive shell in a worker's sandbox (``workers.agent.shell``).

    ``id`` is the random shell id the agent's streams are named by.  A shell is
    open while ``closed_at`` is null; ``exit_code`` is the shell's status when the
    agent reported one (-N: killed by signal N).
    """

    id = models.CharField(primary_key=True, max_length=32)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="shells")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shells")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="shells"
    )
    node = models.CharField(max_length=128)
    worker_id = models.CharField(max_length=128)
    argv = models.JSONField(default=list, blank=True, help_text="Empty: the login shell.")
    opened_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    exit_code = models.IntegerField(null=True, blank=True)
    bytes_in = models.BigIntegerField(default=0)
    bytes_out = models.BigIntegerField(default=0)
    close_reason = models.CharField(max_length=200, blank=True, default="")
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The admin who closed it; null when it ended by itself or its client left.",
    )

    objects = ShellQuerySet.as_manager()

    class Meta:
        ordering = ["-opened_at"]

    def __str__(self) -> str:
        return f"shell {self.id[:8]} in job {self.job_id}/{self.worker_id}"
