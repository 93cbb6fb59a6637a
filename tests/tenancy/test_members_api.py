"""``/api/v1/tenants/<slug>/members/``: owners manage members; members see them; outsiders 404."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Membership, Role, Tenant
from tenancy.token_services import do_issue_token
from tests.conftest import job_body

pytestmark = pytest.mark.django_db

Client = Callable[[Any], APIClient]


def owner_of(tenant: Tenant) -> Any:
    return tenant.memberships.get(role=Role.OWNER).user


def members_url(tenant: Tenant, user_id: int | None = None) -> str:
    base = f"/api/v1/tenants/{tenant.slug}/members/"
    return base if user_id is None else f"{base}{user_id}/"


def job_names(client: APIClient) -> set[str]:
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 200
    return {job["name"] for job in response.json()["results"]}


def memberships(tenant: Tenant) -> list[tuple[str, str]]:
    return sorted(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))


def test_an_added_member_sees_the_tenants_jobs_until_removed(
    token_client: Client, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = owner_of(acme)
    spec = check_job_spec(tenant=acme, data=job_body(name="acme-train", gpus=1))
    do_submit_job(user=owner, tenant=acme, spec=spec)
    carol = make_user("carol")
    as_owner, as_carol = token_client(owner), token_client(carol)
    assert job_names(as_carol) == set()

    added = as_owner.post(members_url(acme), {"username": "carol", "role": "viewer"}, format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["username"] == "carol" and added.json()["role"] == "viewer"
    assert job_names(as_carol) == {"acme-train"}
    listed = as_carol.get(members_url(acme)).json()  # a viewer sees who else is in it
    assert [(m["username"], m["role"]) for m in listed] == [
        ("acme-owner", "owner"),
        ("carol", "viewer"),
    ]
    assert all(m["since"] for m in listed)

    assert as_owner.delete(members_url(acme, carol.pk)).status_code == 204
    # Her token relied on the membership: revoked with it (issue 35; docs/tokens.md).
    assert as_carol.get("/api/v1/jobs/").status_code == 401
    assert job_names(token_client(carol)) == set()  # a new token sees nothing of acme
    assert token_client(carol).get(members_url(acme)).status_code == 404
    actions = list(
        AuditEntry.objects.filter(action__startswith="membership.").values_list(
            "action", "actor_name", "via"
        )
    )
    via = f"token default ({owner.api_tokens.get().prefix}…)"
    assert sorted(actions) == [
        ("membership.add", "acme-owner", via),
        ("membership.remove", "acme-owner", via),
    ]


def test_an_owner_changes_a_role_by_patch(token_client: Client, alice: Any, acme: Tenant) -> None:
    response = token_client(owner_of(acme)).patch(
        members_url(acme, alice.pk), {"role": "owner"}, format="json"
    )
    assert response.status_code == 200 and response.json()["role"] == "owner"
    entry = AuditEntry.objects.get(action="membership.role")
    assert (entry.before["role"], entry.after["role"]) == ("member", "owner")
    assert entry.actor_name == "acme-owner" and entry.via.startswith("token default")


def test_the_last_owner_is_kept_through_the_api(token_client: Client, acme: Tenant) -> None:
    owner = owner_of(acme)
    client = token_client(owner)
    rows = AuditEntry.objects.count()
    demoted = client.patch(members_url(acme, owner.pk), {"role": "member"}, format="json")
    assert demoted.status_code == 400
    assert "last owner" in demoted.json()["message"]
    removed = client.delete(members_url(acme, owner.pk))
    assert removed.status_code == 400 and "last owner" in removed.json()["message"]
    assert memberships(acme) == [("acme-owner", "owner")]
    assert AuditEntry.objects.count() == rows


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_get_403_on_changes(
    role: str, token_client: Client, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    someone = make_user("someone", acme, role=role)
    make_user("newbie")
    owner = owner_of(acme)
    client = token_client(someone)
    kept = memberships(acme)
    assert client.get(members_url(acme)).status_code == 200
    answers = [
        client.post(members_url(acme), {"username": "newbie"}, format="json"),
        client.patch(members_url(acme, owner.pk), {"role": "viewer"}, format="json"),
        client.patch(members_url(acme, someone.pk), {"role": "owner"}, format="json"),
        client.delete(members_url(acme, owner.pk)),
    ]
    assert [a.status_code for a in answers] == [403, 403, 403, 403]
    assert memberships(acme) == kept


def test_an_outsider_gets_404_everywhere(
    token_client: Client, acme: Tenant, bob: Any, alice: Any
) -> None:
    client = token_client(bob)  # a member of globex
    answers = [
        client.get(members_url(acme)),
        client.post(members_url(acme), {"username": "bob"}, format="json"),
        client.patch(members_url(acme, alice.pk), {"role": "owner"}, format="json"),
        client.delete(members_url(acme, alice.pk)),
        client.get("/api/v1/tenants/no-such-tenant/members/"),
    ]
    assert [a.status_code for a in answers] == [404] * 5
    assert {a.json()["message"] for a in answers} == {"Not found."}


def test_a_read_only_token_of_an_owner_cannot_change_members(
    acme: Tenant, make_user: Callable[..., Any]
) -> None:
    make_user("newbie")
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Token {do_issue_token(user=owner_of(acme), scope='read')}"
    )
    assert client.get(members_url(acme)).status_code == 200
    assert client.post(members_url(acme), {"username": "newbie"}, format="json").status_code == 403
    assert len(memberships(acme)) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"username": "nobody"}, "no user 'nobody'"),
        ({"email": "nobody@example.org"}, "no user"),
        ({"username": "carol", "role": "root"}, "role"),
        ({"username": "x" * 100_000}, "username"),
        ({"username": "carol", "email": "carol@example.org"}, "exactly one"),
        ({}, "exactly one"),
        ({"username": "carol", "is_staff": True}, "unknown field(s): is_staff"),
        ({"username": ["carol"]}, "username"),
        ({"username": "alice"}, "already a member"),
    ],
)
def test_hostile_invitations_are_clear_400s_that_change_nothing(
    body: dict[str, Any],
    message: str,
    token_client: Client,
    acme: Tenant,
    alice: Any,
    make_user: Callable[..., Any],
) -> None:
    make_user("carol")
    client = token_client(owner_of(acme))  # its token's creation is audited: count after it
    kept, rows = memberships(acme), AuditEntry.objects.count()
    response = client.post(members_url(acme), body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert message in response.json()["message"] or message in str(response.json()["errors"])
    assert len(response.content) < 2000
    assert (memberships(acme), AuditEntry.objects.count()) == (kept, rows)


def test_another_tenants_member_id_and_bad_roles_change_nothing(
    token_client: Client, acme: Tenant, globex: Tenant, alice: Any, bob: Any
) -> None:
    client = token_client(owner_of(acme))
    kept_acme, kept_globex = memberships(acme), memberships(globex)
    rows = AuditEntry.objects.count()
    # bob belongs to globex: through acme's URL he is nobody
    assert (
        client.patch(members_url(acme, bob.pk), {"role": "viewer"}, format="json").status_code
        == 404
    )
    assert client.delete(members_url(acme, bob.pk)).status_code == 404
    assert client.delete(members_url(acme, 999_999)).status_code == 404
    for body in ({"role": "admin"}, {"role": "o" * 50_000}, {}, {"role": "viewer", "user": 1}):
        answer = client.patch(members_url(acme, alice.pk), body, format="json")
        assert answer.status_code == 400, body
    assert (memberships(acme), memberships(globex)) == (kept_acme, kept_globex)
    assert AuditEntry.objects.count() == rows


def test_an_admin_who_is_no_member_manages_members(
    token_client: Client, acme: Tenant, alice: Any, make_user: Callable[..., Any]
) -> None:
    admin = make_user("root", staff=True)
    client = token_client(admin)
    assert (
        client.patch(members_url(acme, alice.pk), {"role": "viewer"}, format="json").status_code
        == 200
    )
    entry = AuditEntry.objects.get(action="membership.role")
    assert (entry.actor_name, entry.tenant_slug) == ("root", "acme")
