"""Serializers for tenancy endpoints."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from rest_framework import serializers

from tenancy.models import Membership, Tenant


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
            "default_max_restarts",
            "max_restarts_ceiling",
            "default_max_runtime_s",
            "max_runtime_ceiling_s",
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
