"""Routes of the tenant pages under ``/tenants/`` (``portal.tenant_views``)."""

from django.urls import path

from portal import tenant_views

urlpatterns = [
    path("", tenant_views.tenant_list, name="tenants"),
    path("new/", tenant_views.tenant_new, name="tenant-new"),
    path("<slug:slug>/settings/", tenant_views.tenant_settings, name="tenant-settings"),
    path("<slug:slug>/members/", tenant_views.members, name="tenant-members"),
    path("<slug:slug>/members/invite/", tenant_views.invite_member, name="tenant-member-invite"),
    path(
        "<slug:slug>/members/<int:user_id>/role/",
        tenant_views.change_role,
        name="tenant-member-role",
    ),
    path(
        "<slug:slug>/members/<int:user_id>/remove/",
        tenant_views.remove_member,
        name="tenant-member-remove",
    ),
]
