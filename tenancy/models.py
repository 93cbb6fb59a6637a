"""Tenancy: tenants, their members and roles, and the one place objects are scoped to a user.

Cluster admins are Django staff users: they see every tenant and the cluster.
Everything a tenant owns is fetched through ``<Model>.objects.restrict(user)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


class Role(models.TextChoices):
    """What a member may do inside a tenant."""

    OWNER = "owner", "Owner"  # manages members and quota requests, submits jobs
    MEMBER = "member", "Member"  # submits and manages jobs
    VIEWER = "viewer", "Viewer"  # reads only


WRITE_ROLES = frozenset({Role.OWNER, Role.MEMBER})


def default_max_queued_jobs() -> int:
    """A new tenant's cap on waiting jobs: ``DEFAULT_TENANT_MAX_QUEUED_JOBS``."""
    return int(settings.DEFAULT_TENANT_MAX_QUEUED_JOBS)


def _is_admin(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_staff)


class TenantQuerySet(models.QuerySet["Tenant"]):
    """Queries over tenants."""

    def restrict(self, user: AbstractBaseUser | AnonymousUser) -> TenantQuerySet:
        """The tenants ``user`` may see: their own, or all of them for cluster admins."""
        if not user.is_authenticated:
            return self.none()
        if _is_admin(user):
            return self.all()
        return self.filter(memberships__user_id=user.pk).distinct()

    def writable_by(self, user: AbstractBaseUser | AnonymousUser) -> TenantQuerySet:
        """The tenants in which ``user`` may submit and change jobs."""
        if not user.is_authenticated:
            return self.none()
        if _is_admin(user):
            return self.all()
        return self.filter(
            memberships__user_id=user.pk, memberships__role__in=WRITE_ROLES
        ).distinct()


class Tenant(models.Model):
    """A team that shares a GPU quota and sees only its own jobs."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    gpu_quota = models.PositiveIntegerField(
        default=8, help_text="Most GPUs this tenant's jobs may hold at once."
    )
    gpu_type_quota = models.JSONField(
        default=dict,
        blank=True,
        help_text="Most GPUs of each type its jobs may hold at once (type slug -> GPUs), "
        "beside gpu_quota; a type not named is bounded by gpu_quota alone.",
    )
    default_cpus_per_gpu = models.PositiveIntegerField(
        default=0, help_text="CPU cores per GPU a job gets when it asks for none (0: none)."
    )
    default_mem_per_gpu_mib = models.PositiveIntegerField(
        default=0, help_text="Host memory (MiB) per GPU a job gets when it asks for none."
    )
    priority_weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text=(
            "Fair-share weight: a tenant whose recent GPU use (decayed, FAIR_SHARE_HALF_LIFE)"
            " is below its share of all weights gets idle GPUs first; 0 = last."
        ),
    )
    profile_jobs = models.BooleanField(
        default=True, help_text="Profile each job's throughput curve on its first run."
    )
    artifact_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days a finished job's checkpoints and artifacts are kept; "
        "empty = the cluster's ARTIFACT_RETENTION_DAYS.",
    )
    log_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days a finished job's log is kept; empty = the cluster's LOG_RETENTION_DAYS.",
    )
    max_queued_jobs = models.PositiveIntegerField(
        default=default_max_queued_jobs,
        help_text="Most jobs this tenant may have waiting (pending or queued) at once; "
        "a submission beyond it is refused.",
    )
    default_max_restarts = models.PositiveIntegerField(
        default=0, help_text="Restarts a job gets when its submission names none."
    )
    max_restarts_ceiling = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most restarts a job may ask for; empty = no ceiling.",
    )
    default_max_runtime_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Run-time limit (seconds since the first start) a job gets when its "
        "submission names none; empty = the ceiling, or no limit.",
    )
    max_runtime_ceiling_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Longest run-time limit a job may ask for, in seconds; empty = no ceiling.",
    )
    default_session_idle_s = models.PositiveIntegerField(
        default=3600,
        validators=[MinValueValidator(1)],
        help_text="Idle timeout (seconds without activity) a session gets when it names none.",
    )
    session_idle_ceiling_s = models.PositiveIntegerField(
        default=86400,
        validators=[MinValueValidator(1)],
        help_text="Longest idle timeout a session may ask for, in seconds.",
    )
    default_session_lifetime_s = models.PositiveIntegerField(
        default=12 * 3600,
        validators=[MinValueValidator(1)],
        help_text="Maximum lifetime (seconds since it first started) a session gets when it "
        "names none.",
    )
    session_lifetime_ceiling_s = models.PositiveIntegerField(
        default=7 * 86400,
        validators=[MinValueValidator(1)],
        help_text="Longest maximum lifetime a session may ask for, in seconds.",
    )
    session_home_quota_mib = models.PositiveIntegerField(
        default=10240,
        help_text="Most MiB of each member's persistent session home (kept between sessions).",
    )
    max_token_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Longest lifetime, in days, of its members' API tokens (tokens act in "
        "every tenant of their user: the shortest maximum applies); empty = the "
        "cluster's API_TOKEN_MAX_DAYS.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        db_table = "portal_tenant"  # moved from the portal app: same table, no data moved
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority_weight__gte=0), name="tenant_weight_nonnegative"
            ),
            models.CheckConstraint(
                condition=models.Q(artifact_retention_days__isnull=True)
                | models.Q(artifact_retention_days__gte=1),
                name="tenant_artifact_retention_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(log_retention_days__isnull=True)
                | models.Q(log_retention_days__gte=1),
                name="tenant_log_retention_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_restarts_ceiling__isnull=True)
                | models.Q(default_max_restarts__lte=models.F("max_restarts_ceiling")),
                name="tenant_restarts_default_within_ceiling",
            ),
            models.CheckConstraint(
                condition=models.Q(default_max_runtime_s__isnull=True)
                | models.Q(default_max_runtime_s__gte=1),
                name="tenant_runtime_default_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_runtime_ceiling_s__isnull=True)
                | models.Q(max_runtime_ceiling_s__gte=1),
                name="tenant_runtime_ceiling_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_token_days__isnull=True) | models.Q(max_token_days__gte=1),
                name="tenant_token_days_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(default_session_idle_s__gte=1)
                & models.Q(default_session_idle_s__lte=models.F("session_idle_ceiling_s")),
                name="tenant_session_idle_default_within_ceiling",
            ),
            models.CheckConstraint(
                condition=models.Q(default_session_lifetime_s__gte=1)
                & models.Q(default_session_lifetime_s__lte=models.F("session_lifetime_ceiling_s")),
                name="tenant_session_lifetime_default_within_ceiling",
            ),
            models.CheckConstraint(
                condition=models.Q(max_runtime_ceiling_s__isnull=True)
                | models.Q(default_max_runtime_s__isnull=True)
                | models.Q(default_max_runtime_s__lte=models.F("max_runtime_ceiling_s")),
                name="tenant_runtime_default_within_ceiling",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's role in a tenant."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "portal_membership"  # moved from the portal app: same table, no data moved
        ordering = ["tenant__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class TenantOwnedQuerySet(models.QuerySet[Any]):
    """Base queryset for every model with a ``tenant`` foreign key.

    ``restrict(user)`` is the only place tenant-owned objects are scoped to a user.
    """

    def restrict(self, user: AbstractBaseUser | AnonymousUser) -> TenantOwnedQuerySet:
        """Objects of the tenants ``user`` belongs to (everything for cluster admins)."""
        if not user.is_authenticated:
            return self.none()
        if _is_admin(user):
            return self.all()
        return self.filter(tenant__memberships__user=user)


class TokenScope(models.TextChoices):
    """What an API token lets its holder do."""

    READ = "read", "Read only"  # safe methods (GET, HEAD, OPTIONS) only
    WRITE = "write", "Read and write"


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    """Queries over API tokens."""

    def restrict(self, user: AbstractBaseUser | AnonymousUser) -> ApiTokenQuerySet:
        """The tokens ``user`` may see and revoke: their own only (admins included)."""
        if not user.is_authenticated:
            return self.none()
        return self.filter(user_id=user.pk)


class ApiToken(models.Model):
    """A named, scoped, expiring API token of a user (``Authorization: Token <secret>``).

    Only the secret's sha256 is stored, with a short prefix for display: the
    secret itself is shown once, when the token is made (``tenancy.token_services``).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=64)
    scope = models.CharField(max_length=5, choices=TokenScope.choices, default=TokenScope.WRITE)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A revoked token frees its name, so "ci" can be made again after revoking it.
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="one_live_token_name_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.scope})"

    @property
    def audit_label(self) -> str:
        """How the audit log names a change made with this token (``audit.context``)."""
        return f"token {self.name} ({self.prefix}…)"


class OidcIdentity(models.Model):
    """The portal user a single sign-on subject signs in as (tenancy.oidc).

    The link is the provider's ``(iss, sub)``, never a username or an email: a provider
    account named ``alice`` must not take over the local ``alice``.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_oidc_subject")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class OidcGrant(models.Model):
    """A role single sign-on gave a user, so that a later sign-in can take it back.

    ``tenancy.oidc`` writes one when a sign-in's groups raise a tenant role (or make the
    user staff: ``tenant`` empty, ``role`` ``staff``), with the role the user held before
    (``replaced_role``, empty for none). At each sign-in the groups are checked again: a
    role they no longer give goes back to ``replaced_role`` (or the membership goes), and
    the row with it. A role changed in the portal since the grant is the portal's, and
    its row is dropped: roles given in the portal have no row, and a sign-in never takes
    them.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_grants"
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="oidc_grants"
    )
    role = models.CharField(max_length=10)
    replaced_role = models.CharField(max_length=10, blank=True, default="")
    granted_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_oidc_grant_per_tenant"),
            models.UniqueConstraint(
                fields=["user"],
                condition=models.Q(tenant__isnull=True),
                name="one_oidc_staff_grant_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} in {self.tenant or 'the cluster'} for {self.user} (single sign-on)"
