"""Serializers for tenancy endpoints: tenants (admins create and configure them), members."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from rest_framework import serializers

from tenancy.models import Membership, Role, Tenant
from tenancy.services import IDENTIFIER_MAX
from tenancy.tenant_settings import INT_MAX, NAME_MAX
from utilities.api.serializers import StrictSerializer


class TenantSerializer(serializers.ModelSerializer[Tenant]):
    """A tenant as its members see it."""

    role = serializers.SerializerMethodField()
    gpus_in_use = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Tenant
        fields = [
            "slug",
            "name",
            "gpu_quota",
            "priority_weight",
            "role",
            "gpus_in_use",
            "max_queued_jobs",
            "profile_jobs",
            "artifact_retention_days",
            "log_retention_days",
            "default_max_restarts",
            "max_restarts_ceiling",
            "default_max_runtime_s",
            "max_runtime_ceiling_s",
            "max_token_days",
            "gpu_type_quota",
            "default_cpus_per_gpu",
            "default_mem_per_gpu_mib",
            "default_session_idle_s",
            "session_idle_ceiling_s",
            "default_session_lifetime_s",
            "session_lifetime_ceiling_s",
            "session_home_quota_mib",
        ]
        read_only_fields = fields

    def get_role(self, tenant: Tenant) -> str | None:
        """The requesting user's role in this tenant (None for admins who are not members)."""
        roles: dict[int, str] = self.context.get("roles", {})
        return roles.get(tenant.pk)


class MembershipSerializer(serializers.ModelSerializer[Membership]):
    """A membership, from the user's side."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = Membership
        fields = ["tenant", "role"]


class MeSerializer(serializers.ModelSerializer[Any]):
    """The authenticated user."""

    memberships = MembershipSerializer(many=True, read_only=True)
    is_admin = serializers.BooleanField(source="is_staff", read_only=True)

    class Meta:
        model = get_user_model()
        fields = ["id", "username", "email", "is_admin", "memberships"]


def _count(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=INT_MAX, **kwargs)


def _days(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=INT_MAX, allow_null=True, **kwargs)


def _seconds(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=INT_MAX, **kwargs)


class TenantSettingsSerializer(StrictSerializer):
    """Tenant settings an admin changes (PATCH: any of them); null clears the optional ones."""

    name = serializers.CharField(max_length=NAME_MAX, required=False)
    gpu_quota = _count(required=False)
    priority_weight = serializers.FloatField(min_value=0, required=False)
    profile_jobs = serializers.BooleanField(required=False)
    max_queued_jobs = _count(required=False)
    artifact_retention_days = _days(required=False)
    log_retention_days = _days(required=False)
    default_max_restarts = _count(required=False)
    max_restarts_ceiling = _count(required=False, allow_null=True)
    default_max_runtime_s = _days(required=False)
    max_runtime_ceiling_s = _days(required=False)
    max_token_days = _days(required=False)
    gpu_type_quota = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text='GPUs of each type its jobs may hold at once, beside gpu_quota: {"h100-80g": '
        "4}; {} clears them. A type not named is bounded by gpu_quota alone.",
    )
    default_cpus_per_gpu = _count(required=False)
    default_mem_per_gpu_mib = _count(required=False)
    default_session_idle_s = _seconds(required=False)
    session_idle_ceiling_s = _seconds(required=False)
    default_session_lifetime_s = _seconds(required=False)
    session_lifetime_ceiling_s = _seconds(required=False)
    session_home_quota_mib = _count(required=False)


class TenantCreateSerializer(StrictSerializer):
    """A new tenant: slug, owner (an existing user's username or email) and its first limits."""

    slug = serializers.SlugField(max_length=50)
    owner = serializers.CharField(max_length=IDENTIFIER_MAX, help_text="Username or email.")
    name = serializers.CharField(max_length=NAME_MAX, required=False)
    gpu_quota = _count(required=False)
    priority_weight = serializers.FloatField(min_value=0, required=False)
    profile_jobs = serializers.BooleanField(required=False)
    max_queued_jobs = _count(required=False)


class MemberSerializer(serializers.ModelSerializer[Membership]):
    """A member of a tenant: who, their role and since when."""

    user_id = serializers.IntegerField(read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    since = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Membership
        fields = ["user_id", "username", "role", "since"]
        read_only_fields = fields


class MemberInviteSerializer(StrictSerializer):
    """Who to add (an existing user: ``username`` or ``email``, one of them) and the role."""

    username = serializers.CharField(max_length=IDENTIFIER_MAX, required=False)
    email = serializers.CharField(max_length=IDENTIFIER_MAX, required=False)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Exactly one of ``username`` and ``email``."""
        attrs = super().validate(attrs)
        given = [k for k in ("username", "email") if attrs.get(k)]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"non_field_errors": ["give exactly one of 'username' and 'email'"]}
            )
        return attrs


class MemberRoleSerializer(StrictSerializer):
    """A member's new role."""

    role = serializers.ChoiceField(choices=Role.choices)
