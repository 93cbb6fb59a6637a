"""Tenancy services: who may change members and tenants, the last-owner rule, one audit row each."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.test import RequestFactory

from audit.context import serving
from audit.models import AuditEntry
from tenancy.models import Membership, Role, Tenant
from tenancy.services import (
    TenancyError,
    TenancyPermissionError,
    do_add_member,
    do_change_role,
    do_create_tenant,
    do_invite_member,
    do_remove_member,
    do_update_tenant,
    find_user,
)
from tenancy.tenant_settings import INT_MAX, SETTINGS

pytestmark = pytest.mark.django_db


def owner_of(tenant: Tenant) -> Any:
    return tenant.memberships.get(role=Role.OWNER).user


def only_entry(**filters: Any) -> AuditEntry:
    """The one audit row matching ``filters`` (fails if there are none or several)."""
    entries = list(AuditEntry.objects.filter(**filters))
    assert len(entries) == 1, entries
    return entries[0]


def state_of(tenant: Tenant) -> tuple[list[tuple[str, str]], dict[str, Any], int]:
    """Members, settings and audit row count: what a refused change must leave as it was."""
    members = sorted(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))
    settings = Tenant.objects.filter(pk=tenant.pk).values(*SETTINGS).get()
    return members, settings, AuditEntry.objects.count()


def test_an_owner_adds_changes_and_removes_a_member_each_leaving_one_row(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    carol = make_user("carol")
    request = RequestFactory().post("/", REMOTE_ADDR="10.0.0.7")
    request.user = owner
    with serving(request):
        added = do_invite_member(tenant=acme, identifier="carol", role=Role.VIEWER, by=owner)
        do_change_role(tenant=acme, user=carol, role=Role.MEMBER, by=owner)
        assert do_remove_member(tenant=acme, user=carol, by=owner) is True

    add = only_entry(action="membership.add")
    assert (add.actor_id, add.actor_name, add.via) == (owner.pk, "acme-owner", "session")
    assert (add.tenant_id, add.tenant_slug, add.client_address) == (acme.pk, "acme", "10.0.0.7")
    assert (add.object_type, add.object_id) == ("tenancy.membership", str(added.pk))
    assert add.before == {}
    assert add.after == {"user_id": carol.pk, "username": "carol", "role": "viewer"}

    role = only_entry(action="membership.role")
    assert role.before == {"user_id": carol.pk, "username": "carol", "role": "viewer"}
    assert role.after == {"user_id": carol.pk, "username": "carol", "role": "member"}

    remove = only_entry(action="membership.remove")
    assert remove.before == {"user_id": carol.pk, "username": "carol", "role": "member"}
    assert remove.after == {}
    assert remove.object_id == str(added.pk)  # the row is gone; the log keeps its id
    assert not Membership.objects.filter(tenant=acme, user=carol).exists()
    assert AuditEntry.objects.filter(action__startswith="membership.").count() == 3


def test_the_same_role_again_writes_no_row(alice: Any, acme: Tenant) -> None:
    before = AuditEntry.objects.count()
    do_change_role(tenant=acme, user=alice, role=Role.MEMBER, by=owner_of(acme))
    assert AuditEntry.objects.count() == before


def test_add_of_an_existing_member_changes_their_role_as_before(alice: Any, acme: Tenant) -> None:
    """Callers that used ``do_add_member`` to set a role keep working, and it is recorded."""
    do_add_member(tenant=acme, user=alice, role=Role.VIEWER)
    assert Membership.objects.get(tenant=acme, user=alice).role == Role.VIEWER
    entry = only_entry(action="membership.role", after__username="alice")
    assert (entry.actor_name, entry.via) == ("system", "direct")


@pytest.mark.parametrize("doing", ["remove", "demote"])
def test_the_last_owner_can_be_neither_removed_nor_demoted(
    doing: str, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    admin = make_user("root", staff=True)
    kept = state_of(acme)
    for by in (owner, admin, None):
        with pytest.raises(TenancyError, match="last owner of 'acme'"):
            if doing == "remove":
                do_remove_member(tenant=acme, user=owner, by=by)
            else:
                do_change_role(tenant=acme, user=owner, role=Role.MEMBER, by=by)
    assert state_of(acme) == kept


def test_with_a_second_owner_the_first_may_step_down(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    dora = make_user("dora", acme, role=Role.OWNER)
    do_change_role(tenant=acme, user=owner, role=Role.MEMBER, by=owner)
    # dora is now the last owner: owner (a member now) can no longer manage, dora cannot leave
    with pytest.raises(TenancyPermissionError):
        do_change_role(tenant=acme, user=dora, role=Role.MEMBER, by=owner)
    with pytest.raises(TenancyError, match="last owner"):
        do_remove_member(tenant=acme, user=dora, by=dora)
    assert Membership.objects.get(tenant=acme, user=dora).role == Role.OWNER


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_cannot_change_members(
    role: str, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    someone = make_user("someone", acme, role=role)
    target = make_user("target", acme)
    make_user("newbie")
    kept = state_of(acme)
    with pytest.raises(TenancyPermissionError):
        do_invite_member(tenant=acme, identifier="newbie", role=Role.MEMBER, by=someone)
    with pytest.raises(TenancyPermissionError):
        do_change_role(tenant=acme, user=target, role=Role.OWNER, by=someone)
    with pytest.raises(TenancyPermissionError):
        do_remove_member(tenant=acme, user=target, by=someone)
    with pytest.raises(TenancyPermissionError):
        do_update_tenant(acme, by=someone, gpu_quota=99)
    assert state_of(acme) == kept


def test_another_tenants_owner_cannot_change_this_tenant(
    acme: Tenant, globex: Tenant, alice: Any
) -> None:
    kept = state_of(acme)
    with pytest.raises(TenancyPermissionError):
        do_remove_member(tenant=acme, user=alice, by=owner_of(globex))
    assert state_of(acme) == kept


@pytest.mark.parametrize(
    ("identifier", "role", "message"),
    [
        ("nobody", Role.MEMBER, "no user 'nobody'"),
        ("x" * 10_000, Role.MEMBER, "1 to 254 characters"),
        ("", Role.MEMBER, "give a username or an email"),
        ("carol", "superuser", "unknown role 'superuser'"),
        ("carol", "o" * 10_000, "unknown role"),
        ("alice", Role.MEMBER, "already a member"),
        ("inactive", Role.MEMBER, "no user 'inactive'"),
    ],
)
def test_hostile_invitations_are_refused_and_change_nothing(
    identifier: str,
    role: str,
    message: str,
    acme: Tenant,
    alice: Any,
    make_user: Callable[..., Any],
) -> None:
    make_user("carol")
    get_user_model().objects.create_user("inactive", is_active=False)
    kept = state_of(acme)
    with pytest.raises(TenancyError, match=message) as refused:
        do_invite_member(tenant=acme, identifier=identifier, role=role, by=owner_of(acme))
    assert len(str(refused.value)) < 300  # a huge input is not echoed back whole
    assert state_of(acme) == kept


def test_an_invitation_finds_a_user_by_email_but_not_an_ambiguous_one(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    erin = make_user("erin")
    erin.email = "Erin@Example.org"
    erin.save()
    assert find_user("erin@example.org") == erin
    for name in ("twin1", "twin2"):
        get_user_model().objects.create_user(name, email="twins@example.org")
    with pytest.raises(TenancyError, match="several users"):
        find_user("twins@example.org")
    do_invite_member(tenant=acme, identifier="ERIN@example.org", role="viewer", by=owner_of(acme))
    assert Membership.objects.get(tenant=acme, user=erin).role == Role.VIEWER


def test_an_admin_updates_only_what_changes_with_one_row(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    admin = make_user("root", staff=True)
    updated = do_update_tenant(
        acme, by=admin, gpu_quota=16, priority_weight=1.0, max_runtime_ceiling_s=7200
    )
    assert (updated.gpu_quota, updated.max_runtime_ceiling_s) == (16, 7200)
    entry = only_entry(action="tenant.update")
    assert (entry.actor_name, entry.via, entry.tenant_slug) == ("root", "direct", "acme")
    assert entry.before == {"gpu_quota": 8, "max_runtime_ceiling_s": None}
    assert entry.after == {"gpu_quota": 16, "max_runtime_ceiling_s": 7200}
    do_update_tenant(acme, by=admin, gpu_quota=16)  # nothing changes: no row
    assert AuditEntry.objects.filter(action="tenant.update").count() == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpu_quota": -1}, "gpu_quota: must be zero or more"),
        ({"gpu_quota": INT_MAX + 1}, "at most"),
        ({"gpu_quota": True}, "must be a number"),
        ({"gpu_quota": "8"}, "must be a number"),
        ({"gpu_quota": 1.5}, "whole number"),
        ({"priority_weight": -0.5}, "priority_weight: must be zero or more"),
        ({"priority_weight": float("inf")}, "finite"),
        ({"priority_weight": float("nan")}, "finite"),
        ({"artifact_retention_days": 0}, "must be 1 or more"),
        ({"max_queued_jobs": None}, "a value is required"),
        ({"name": ""}, "1 to 100 characters"),
        ({"name": "n" * 101}, "1 to 100 characters"),
        ({"slug": "renamed"}, "'slug' is not a tenant setting"),
        ({"default_max_restarts": 5, "max_restarts_ceiling": 2}, "must not exceed"),
        ({"max_runtime_ceiling_s": 10, "default_max_runtime_s": 60}, "must not exceed"),
        ({"session_idle_ceiling_s": 60, "default_session_idle_s": 600}, "must not exceed"),
        ({"default_session_lifetime_s": 10**6, "session_lifetime_ceiling_s": 10}, "must not"),
        ({"default_session_idle_s": 0}, "must be 1 or more"),
        ({"session_home_quota_mib": -1}, "must be zero or more"),
    ],
)
def test_bad_settings_are_refused_in_words_and_change_nothing(
    fields: dict[str, Any], message: str, acme: Tenant
) -> None:
    kept = state_of(acme)
    with pytest.raises(TenancyError, match=message):
        do_update_tenant(acme, **fields)
    assert state_of(acme) == kept


def test_lowering_a_ceiling_under_the_current_default_is_refused(acme: Tenant) -> None:
    do_update_tenant(acme, default_max_restarts=3)
    with pytest.raises(TenancyError, match=r"default_max_restarts \(3\) must not exceed"):
        do_update_tenant(acme, max_restarts_ceiling=1)
    acme.refresh_from_db()
    assert acme.max_restarts_ceiling is None


def test_create_records_the_settings_and_the_owner_and_needs_an_admin(
    make_user: Callable[..., Any],
) -> None:
    admin = make_user("root", staff=True)
    make_user("vera")
    with pytest.raises(TenancyPermissionError):
        do_create_tenant(slug="nope", owner_username="vera", create_owner=False, by=make_user("x"))
    with pytest.raises(TenancyError, match="no user 'ghost'"):
        do_create_tenant(slug="ghosts", owner_username="ghost", create_owner=False, by=admin)
    assert not Tenant.objects.exists() and not get_user_model().objects.filter(username="ghost")
    created = do_create_tenant(
        slug="vision", owner_username="vera", create_owner=False, gpu_quota=4, by=admin
    )
    assert Membership.objects.get(tenant=created.tenant).user.username == "vera"
    entry = only_entry(action="tenant.create")
    assert (entry.actor_name, entry.tenant_slug) == ("root", "vision")
    assert entry.after["owner"] == "vera" and entry.after["gpu_quota"] == 4
    assert entry.after["slug"] == "vision" and entry.before == {}


def test_createtenant_is_recorded_as_the_command() -> None:
    call_command("createtenant", "cli", "--owner", "carl", stdout=StringIO())
    entry = only_entry(action="tenant.create")
    assert (entry.actor_id, entry.actor_name, entry.via) == (
        None,
        "system",
        "manage.py createtenant",
    )


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(
    make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    """The tenant row is locked by each membership change: the second waits, then is refused."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    import threading

    acme = make_tenant("acme")
    first = owner_of(acme)
    second = make_user("second", acme, role=Role.OWNER)
    results: list[str] = []
    barrier = threading.Barrier(2)

    def demote(user: Any) -> None:
        try:
            barrier.wait(timeout=5)
            with transaction.atomic():
                do_change_role(tenant=acme, user=user, role=Role.MEMBER, by=user)
            results.append("ok")
        except TenancyError as refused:
            results.append(str(refused))
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(u,)) for u in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(r == "ok" for r in results) == [False, True], results
    assert Membership.objects.filter(tenant=acme, role=Role.OWNER).count() == 1
    assert AuditEntry.objects.filter(action="membership.role").count() == 1
