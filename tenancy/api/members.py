"""``/api/v1/tenants/<slug>/members/``: who is in a tenant; its owners (and admins) change it.

    GET    /tenants/<slug>/members/            any member (viewers too) or admin
    POST   /tenants/<slug>/members/            owner/admin: {username | email, role}
    PATCH  /tenants/<slug>/members/<user_id>/  owner/admin: {role}
    DELETE /tenants/<slug>/members/<user_id>/  owner/admin

A tenant the caller cannot see is a 404, and so is a user who is not a member of
this tenant; a member who is not an owner gets a 403 on a change.  Refusals of
the services (unknown user, last owner) are 400s with the reason.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from tenancy.api.serializers import MemberInviteSerializer, MemberRoleSerializer, MemberSerializer
from tenancy.models import Membership, Tenant
from tenancy.services import (
    can_manage_members,
    do_change_role,
    do_invite_member,
    do_remove_member,
)

OWNERS_ONLY = "only the tenant's owners may change its members"


class TenantMemberViewSet(viewsets.GenericViewSet[Membership]):
    """The members of one tenant, with their roles and since when."""

    serializer_class = MemberSerializer
    pagination_class = None
    lookup_field = "user_id"

    def tenant(self) -> Tenant:
        """The tenant of the URL, if the caller may see it (else 404)."""
        return get_object_or_404(
            Tenant.objects.restrict(self.request.user), slug=self.kwargs["slug"]
        )

    def managed_tenant(self) -> Tenant:
        """The tenant of the URL, if the caller may change its members (404 unseen, else 403)."""
        tenant = self.tenant()
        if not can_manage_members(self.request.user, tenant):
            raise PermissionDenied(OWNERS_ONLY)
        return tenant

    def get_queryset(self) -> QuerySet[Membership]:
        return (
            Membership.objects.filter(tenant=self.tenant())
            .select_related("user")
            .order_by("user__username")
        )

    def list(self, request: Request, slug: str) -> Response:
        """The tenant's members."""
        return Response(self.get_serializer(self.get_queryset(), many=True).data)

    @extend_schema(request=MemberInviteSerializer, responses={201: MemberSerializer})
    def create(self, request: Request, slug: str) -> Response:
        """Add an existing user to the tenant with a role (owners and admins)."""
        tenant = self.managed_tenant()
        fields = MemberInviteSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        data = fields.validated_data
        membership = do_invite_member(
            tenant=tenant,
            identifier=data.get("username") or data["email"],
            role=data["role"],
            by=request.user,
        )
        return Response(self.get_serializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MemberRoleSerializer, responses=MemberSerializer)
    def partial_update(self, request: Request, slug: str, user_id: int) -> Response:
        """Change a member's role (owners and admins; the last owner keeps theirs)."""
        tenant = self.managed_tenant()
        membership = get_object_or_404(
            Membership.objects.select_related("user"), tenant=tenant, user_id=user_id
        )
        fields = MemberRoleSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        changed = do_change_role(
            tenant=tenant, user=membership.user, role=fields.validated_data["role"], by=request.user
        )
        return Response(self.get_serializer(changed).data)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, slug: str, user_id: int) -> Response:
        """Remove a member (owners and admins; not the last owner)."""
        tenant = self.managed_tenant()
        membership = get_object_or_404(
            Membership.objects.select_related("user"), tenant=tenant, user_id=user_id
        )
        do_remove_member(tenant=tenant, user=membership.user, by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


members = TenantMemberViewSet.as_view({"get": "list", "post": "create"})
member = TenantMemberViewSet.as_view({"patch": "partial_update", "delete": "destroy"})
