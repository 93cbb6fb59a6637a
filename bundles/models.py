"""Code bundles: a tenant's training program as an archive, known by its sha256.

The archive itself lives in the artifact store (``workers.artifacts``) at
``CodeBundle.store_path``; the row says whose it is and what is inside.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenancy.models import Tenant, TenantOwnedQuerySet


class ArchiveKind(models.TextChoices):
    """How the archive is packed (detected from its bytes, not its name)."""

    TAR_GZ = "tar.gz", "tar.gz"
    ZIP = "zip", "zip"


class CodeBundle(models.Model):
    """An uploaded code archive of one tenant; the same bytes are stored once per tenant."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="code_bundles")
    sha256 = models.CharField(max_length=64, help_text="The archive's sha256: the bundle's id.")
    kind = models.CharField(max_length=6, choices=ArchiveKind.choices)
    size = models.PositiveBigIntegerField(help_text="Bytes of the archive.")
    file_count = models.PositiveIntegerField()
    files = models.JSONField(default=list, help_text='[{"path": ..., "size": ...}] of its files.')
    unpacked_bytes = models.PositiveBigIntegerField()
    requirements = models.JSONField(
        default=list,
        blank=True,
        help_text="What its top-level requirements.txt or pyproject.toml declares "
        "(workers.environment.bundle_requirements), normalised; installed before a job's own.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="code_bundles",
    )

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="one_bundle_per_tenant_sha")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.sha256[:12]}"

    @property
    def store_path(self) -> str:
        """Where the archive lives in the artifact store."""
        return f"tenants/{self.tenant.slug}/bundles/{self.sha256}.{self.kind}"
