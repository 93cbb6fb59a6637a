"""Admins create tenants and set their quotas on the portal's own pages and through the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from jobs.services import check_job_spec, do_submit_job
from tenancy.api.serializers import TenantSettingsSerializer
from tenancy.models import Membership, Role, Tenant
from tenancy.tenant_settings import SETTINGS
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Any:
    return make_user("root", staff=True)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


SETTINGS_FORM = {
    "name": "Acme ML",
    "gpu_quota": "8",
    "priority_weight": "1.0",
    "profile_jobs": "on",
    "max_queued_jobs": "100",
    "artifact_retention_days": "",
    "log_retention_days": "",
    "default_max_restarts": "0",
    "max_restarts_ceiling": "",
    "default_max_runtime_s": "",
    "max_runtime_ceiling_s": "",
    "default_session_idle_s": "3600",
    "session_idle_ceiling_s": "86400",
    "default_session_lifetime_s": "43200",
    "session_lifetime_ceiling_s": "604800",
    "session_home_quota_mib": "10240",
}


def test_an_admin_creates_a_tenant_and_edits_its_quota_on_the_pages(
    admin: Any, make_user: Callable[..., Any]
) -> None:
    make_user("vera")
    client = signed_in(admin)
    assert 'href="/tenants/"' in client.get("/").content.decode()  # the nav link
    form = {"slug": "vision", "owner": "vera", "name": "", "gpu_quota": "4"}
    form |= {"priority_weight": "2.5", "max_queued_jobs": "10"}
    created = client.post("/tenants/new/", form)
    assert created.status_code == 302, created.content.decode()[:2000]
    vision = Tenant.objects.get(slug="vision")
    assert (vision.name, vision.gpu_quota, vision.priority_weight) == ("vision", 4, 2.5)
    assert vision.max_queued_jobs == 10
    assert Membership.objects.get(tenant=vision).user.username == "vera"

    page = client.get("/tenants/vision/settings/").content.decode()
    assert 'name="gpu_quota"' in page and 'value="4"' in page
    edited = client.post(
        "/tenants/vision/settings/", SETTINGS_FORM | {"name": "Vision", "gpu_quota": "12"}
    )
    assert edited.status_code == 302, edited.content.decode()[:2000]
    vision.refresh_from_db()
    assert (vision.gpu_quota, vision.priority_weight, vision.max_queued_jobs) == (12, 1.0, 100)
    update = AuditEntry.objects.get(action="tenant.update")
    assert update.before == {"name": "vision", "gpu_quota": 4, "priority_weight": 2.5,
                             "max_queued_jobs": 10}  # fmt: skip
    assert update.after == {"name": "Vision", "gpu_quota": 12, "priority_weight": 1.0,
                            "max_queued_jobs": 100}  # fmt: skip
    assert (update.actor_name, update.via) == ("root", "session")
    assert AuditEntry.objects.get(action="tenant.create").actor_name == "root"


def test_the_list_shows_every_tenant_with_its_use(
    admin: Any, acme: Tenant, globex: Tenant, alice: Any
) -> None:
    spec = check_job_spec(tenant=acme, data=job_body(gpus=1))
    do_submit_job(user=alice, tenant=acme, spec=spec)
    page = signed_in(admin).get("/tenants/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-tenant="acme"' in text and 'data-tenant="globex"' in text
    acme_row = text.split('data-tenant="acme"')[1].split("</tr>")[0]
    assert '<td data-field="members">2</td>' in acme_row
    assert "0 / 8" in acme_row and "1 / 100" in acme_row  # GPUs in use / quota, waiting / cap


def test_bad_input_on_the_admin_pages_is_a_400_that_changes_nothing(
    admin: Any, acme: Tenant
) -> None:
    client = signed_in(admin)
    rows = AuditEntry.objects.count()
    for form in (
        {"slug": "acme", "owner": "root", "gpu_quota": "1", "priority_weight": "1",
         "max_queued_jobs": "1"},
        {"slug": "new", "owner": "ghost", "gpu_quota": "1", "priority_weight": "1",
         "max_queued_jobs": "1"},
        {"slug": "Bad Slug", "owner": "root", "gpu_quota": "-1", "priority_weight": "nan",
         "max_queued_jobs": "1"},
        {"slug": "n" * 5000, "owner": "o" * 5000, "gpu_quota": "9" * 50,
         "priority_weight": "1", "max_queued_jobs": "1"},
    ):  # fmt: skip
        assert client.post("/tenants/new/", form).status_code == 400, form["slug"][:20]
    for change in (
        {"gpu_quota": "-3"},
        {"priority_weight": "inf"},
        {"default_max_restarts": "5", "max_restarts_ceiling": "2"},
        {"artifact_retention_days": "0"},
        {"name": ""},
    ):
        answer = client.post("/tenants/acme/settings/", SETTINGS_FORM | change)
        assert answer.status_code == 400, change
    ceiling = client.post(
        "/tenants/acme/settings/",
        SETTINGS_FORM | {"default_max_restarts": "5", "max_restarts_ceiling": "2"},
    )
    assert "must not exceed" in ceiling.content.decode()
    assert Tenant.objects.count() == 1 and AuditEntry.objects.count() == rows
    acme.refresh_from_db()
    assert acme.gpu_quota == 8


def test_the_admin_pages_are_not_found_for_anyone_else(acme: Tenant, alice: Any) -> None:
    owner = signed_in(acme.memberships.get(role=Role.OWNER).user)
    for url in ("/tenants/", "/tenants/new/", "/tenants/acme/settings/"):
        assert owner.get(url).status_code == 404
    assert (
        owner.post("/tenants/acme/settings/", SETTINGS_FORM | {"gpu_quota": "99"}).status_code
        == 404
    )
    acme.refresh_from_db()
    assert acme.gpu_quota == 8
    assert Client().get("/tenants/").status_code == 302  # to the login page


def test_an_admin_creates_and_configures_a_tenant_through_the_api(
    admin: Any, token_client: Callable[[Any], APIClient], make_user: Callable[..., Any]
) -> None:
    make_user("vera").__class__.objects.filter(username="vera").update(email="vera@example.org")
    client = token_client(admin)
    created = client.post(
        "/api/v1/tenants/",
        {"slug": "vision", "owner": "vera@example.org", "gpu_quota": 4, "priority_weight": 2},
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["slug"], body["gpu_quota"], body["priority_weight"]) == ("vision", 4, 2.0)
    assert body["gpus_in_use"] == 0
    changed = client.patch(
        "/api/v1/tenants/vision/",
        {"gpu_quota": 16, "max_runtime_ceiling_s": 3600, "default_max_runtime_s": 600},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["gpu_quota"] == 16
    assert changed.json()["default_max_runtime_s"] == 600
    entry = AuditEntry.objects.get(action="tenant.update")
    assert entry.after == {"gpu_quota": 16, "default_max_runtime_s": 600,
                           "max_runtime_ceiling_s": 3600}  # fmt: skip
    assert entry.actor_name == "root" and entry.via.startswith("token default")
    cleared = client.patch(
        "/api/v1/tenants/vision/", {"max_runtime_ceiling_s": None}, format="json"
    )
    assert cleared.status_code == 200 and cleared.json()["max_runtime_ceiling_s"] is None
    sessions = {"session_idle_ceiling_s": 7200, "default_session_idle_s": 900}
    sessions |= {"session_home_quota_mib": 2048}
    limited = client.patch("/api/v1/tenants/vision/", sessions, format="json")
    assert limited.status_code == 200, limited.json()
    assert {name: limited.json()[name] for name in sessions} == sessions
    above = client.patch("/api/v1/tenants/vision/", {"default_session_idle_s": 7201}, format="json")
    assert above.status_code == 400 and "session_idle_ceiling_s" in str(above.json())
    assert Tenant.objects.get(slug="vision").default_session_idle_s == 900


@pytest.mark.parametrize(
    "body",
    [
        {"gpu_quota": -1},
        {"gpu_quota": 2**40},
        {"gpu_quota": "lots"},
        '{"priority_weight": 1e400}',
        '{"priority_weight": NaN}',
        {"slug": "renamed"},
        {"name": "n" * 10_000},
        {"default_max_restarts": 3, "max_restarts_ceiling": 1},
        {"log_retention_days": 0},
    ],
)
def test_bad_settings_through_the_api_are_400s_that_change_nothing(
    body: dict[str, Any] | str,
    admin: Any,
    acme: Tenant,
    token_client: Callable[[Any], APIClient],
) -> None:
    before = Tenant.objects.filter(pk=acme.pk).values(*SETTINGS).get()
    client = token_client(admin)  # its token's creation is audited: count after it
    rows = AuditEntry.objects.count()
    if isinstance(body, str):  # JSON the test client would not write: infinities, NaN
        answer = client.patch("/api/v1/tenants/acme/", body, content_type="application/json")
    else:
        answer = client.patch("/api/v1/tenants/acme/", body, format="json")
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["message"] and len(answer.content) < 2000
    assert Tenant.objects.filter(pk=acme.pk).values(*SETTINGS).get() == before
    assert AuditEntry.objects.count() == rows


def test_non_admins_get_403_and_outsiders_404_on_the_tenant_api(
    acme: Tenant, alice: Any, bob: Any, token_client: Callable[[Any], APIClient]
) -> None:
    owner = acme.memberships.get(role=Role.OWNER).user
    for user in (owner, alice):
        client = token_client(user)
        made = client.post("/api/v1/tenants/", {"slug": "mine", "owner": "bob"}, format="json")
        assert made.status_code == 403
        patched = client.patch("/api/v1/tenants/acme/", {"gpu_quota": 64}, format="json")
        assert patched.status_code == 403
    outsider = token_client(bob).patch("/api/v1/tenants/acme/", {"gpu_quota": 64}, format="json")
    assert outsider.status_code == 404
    acme.refresh_from_db()
    assert acme.gpu_quota == 8 and not Tenant.objects.filter(slug="mine").exists()


def test_django_admin_saves_through_the_service_and_shows_members_read_only(
    admin: Any, acme: Tenant, alice: Any
) -> None:
    admin.is_superuser = True
    admin.save()
    client = signed_in(admin)
    url = f"/admin/tenancy/tenant/{acme.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="memberships-0-role"' not in page  # members are read-only here
    assert client.get("/admin/tenancy/tenant/add/").status_code == 403
    assert (
        client.post(f"/admin/tenancy/tenant/{acme.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    form = SETTINGS_FORM | {
        "name": acme.name,
        "gpu_quota": "24",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
    }
    assert client.post(url, form).status_code == 302
    entry = AuditEntry.objects.get(action="tenant.update")
    assert (entry.before, entry.after) == ({"gpu_quota": 8}, {"gpu_quota": 24})
    assert (entry.actor_name, entry.via) == ("root", "session")
    refused = client.post(url, form | {"default_max_restarts": "4", "max_restarts_ceiling": "1"})
    assert refused.status_code == 200  # the admin shows the form again with the error
    acme.refresh_from_db()
    assert (acme.gpu_quota, acme.default_max_restarts) == (24, 0)
    assert Membership.objects.filter(tenant=acme).count() == 2


def test_the_api_settings_and_the_services_name_the_same_fields() -> None:
    assert set(TenantSettingsSerializer().fields) == set(SETTINGS)


def test_the_tenant_list_takes_as_many_queries_for_ten_tenants_as_for_one(
    admin: Any, make_tenant: Callable[..., Tenant], django_assert_num_queries: Any
) -> None:
    client = signed_in(admin)
    make_tenant("t0")
    client.get("/tenants/")  # the session and user are read once, like every page
    with django_assert_num_queries(5) as one:  # session, user, nav tenants, tenants, members
        assert client.get("/tenants/").status_code == 200
    for n in range(1, 10):
        make_tenant(f"t{n}")
    with django_assert_num_queries(len(one.captured_queries)):
        assert b"t9" in client.get("/tenants/").content
