"""The members page: everyone in the tenant sees it; owners invite, change roles and remove."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEntry
from tenancy.models import Membership, Role, Tenant

pytestmark = pytest.mark.django_db


def owner_of(tenant: Tenant) -> Any:
    return tenant.memberships.get(role=Role.OWNER).user


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def memberships(tenant: Tenant) -> list[tuple[str, str]]:
    return sorted(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))


def test_an_owner_invites_changes_and_removes_on_the_page(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    carol = make_user("carol")
    client = signed_in(owner)
    page = client.get("/tenants/acme/members/").content.decode()
    assert 'id="invite-form"' in page and "acme-owner" in page
    assert "/tenants/acme/members/" in client.get("/").content.decode()  # linked from the header

    added = client.post("/tenants/acme/members/invite/", {"identifier": "carol", "role": "viewer"})
    assert added.status_code == 302 and added["Location"] == "/tenants/acme/members/"
    assert ("carol", "viewer") in memberships(acme)

    changed = client.post(f"/tenants/acme/members/{carol.pk}/role/", {"role": "member"})
    assert changed.status_code == 302
    assert ("carol", "member") in memberships(acme)

    confirm = client.get(f"/tenants/acme/members/{carol.pk}/remove/")
    assert confirm.status_code == 200 and "Remove carol?" in confirm.content.decode()
    assert ("carol", "member") in memberships(acme)  # a GET only asks
    removed = client.post(f"/tenants/acme/members/{carol.pk}/remove/")
    assert removed.status_code == 302
    assert memberships(acme) == [("acme-owner", "owner")]
    actions = sorted(
        AuditEntry.objects.filter(actor_id=owner.pk).values_list("action", "via", "actor_name")
    )
    assert actions == [
        ("membership.add", "session", "acme-owner"),
        ("membership.remove", "session", "acme-owner"),
        ("membership.role", "session", "acme-owner"),
    ]


def test_refusals_are_shown_on_the_page_and_change_nothing(
    acme: Tenant, alice: Any, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    client = signed_in(owner)
    kept, rows = memberships(acme), AuditEntry.objects.count()
    unknown = client.post(
        "/tenants/acme/members/invite/", {"identifier": "ghost", "role": "member"}
    )
    assert unknown.status_code == 400 and "no user &#x27;ghost&#x27;" in unknown.content.decode()
    huge = client.post("/tenants/acme/members/invite/", {"identifier": "g" * 5000, "role": "x"})
    assert huge.status_code == 400
    bad_role = client.post(f"/tenants/acme/members/{alice.pk}/role/", {"role": "emperor"})
    assert bad_role.status_code == 400
    last = client.post(f"/tenants/acme/members/{owner.pk}/role/", {"role": "viewer"})
    assert last.status_code == 400 and "last owner" in last.content.decode()
    gone = client.post(f"/tenants/acme/members/{owner.pk}/remove/")
    assert gone.status_code == 400 and "last owner" in gone.content.decode()
    assert (memberships(acme), AuditEntry.objects.count()) == (kept, rows)


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_see_the_list_but_get_403_on_changes(
    role: str, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    someone = make_user("someone", acme, role=role)
    make_user("newbie")
    owner = owner_of(acme)
    client = signed_in(someone)
    page = client.get("/tenants/acme/members/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "acme-owner" in text and "invite-form" not in text and "role-form" not in text
    kept = memberships(acme)
    answers = [
        client.post("/tenants/acme/members/invite/", {"identifier": "newbie", "role": "owner"}),
        client.post(f"/tenants/acme/members/{someone.pk}/role/", {"role": "owner"}),
        client.get(f"/tenants/acme/members/{owner.pk}/remove/"),
        client.post(f"/tenants/acme/members/{owner.pk}/remove/"),
    ]
    assert [a.status_code for a in answers] == [403] * 4
    assert memberships(acme) == kept


def test_an_outsider_gets_404_and_another_tenants_member_is_not_found(
    acme: Tenant, globex: Tenant, alice: Any, bob: Any
) -> None:
    outsider = signed_in(bob)
    for url in (
        "/tenants/acme/members/",
        f"/tenants/acme/members/{alice.pk}/remove/",
    ):
        assert outsider.get(url).status_code == 404
    assert (
        outsider.post(f"/tenants/acme/members/{alice.pk}/role/", {"role": "owner"}).status_code
        == 404
    )
    owner = signed_in(owner_of(acme))
    assert owner.post(f"/tenants/acme/members/{bob.pk}/remove/").status_code == 404
    assert (
        owner.post(f"/tenants/acme/members/{bob.pk}/role/", {"role": "viewer"}).status_code == 404
    )
    assert memberships(globex) == [("bob", "member"), ("globex-owner", "owner")]


def test_an_owner_who_removes_themselves_lands_on_the_dashboard(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    second = make_user("second", acme, role=Role.OWNER)
    response = signed_in(second).post(f"/tenants/acme/members/{second.pk}/remove/")
    assert response.status_code == 302 and response["Location"] == "/"
    assert ("second", "owner") not in memberships(acme)
