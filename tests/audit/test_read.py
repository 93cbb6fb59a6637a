"""Reading the audit log: the API, the page and the CSV; an owner never sees another tenant's rows."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.services import record
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from portal import audit_views
from tenancy.models import Role, Tenant
from tenancy.token_services import do_create_token
from tests.conftest import job_body

pytestmark = pytest.mark.django_db
User = get_user_model()


def submit(user: Any, tenant: Tenant, name: str = "train") -> Any:
    spec = check_job_spec(tenant=tenant, data=job_body(name=name))
    return do_submit_job(user=user, tenant=tenant, spec=spec)


@pytest.fixture
def history(acme: Tenant, globex: Tenant) -> dict[str, Any]:
    """Jobs of both tenants, one cancelled, and a token made (a row with no tenant)."""
    acme_owner = User.objects.get(username="acme-owner")
    globex_owner = User.objects.get(username="globex-owner")
    a = submit(acme_owner, acme, "a-job")
    submit(globex_owner, globex, "g-job")
    do_cancel_job(user=acme_owner, job_id=a.pk)
    do_create_token(user=acme_owner, name="laptop")
    return {"acme_owner": acme_owner, "globex_owner": globex_owner, "acme_job": a}


def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def session(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_reads_every_row_and_an_owner_only_their_tenants(
    history: dict[str, Any], make_user: Any
) -> None:
    admin = make_user("root", staff=True)
    everything = api(admin).get("/api/v1/audit/?page_size=200").json()
    actions = {(r["action"], r["tenant"]) for r in everything["results"]}
    assert {("job.submit", "acme"), ("job.submit", "globex"), ("job.cancel", "acme")} <= actions
    assert ("token.create", "") in actions

    owned = api(history["acme_owner"]).get("/api/v1/audit/?page_size=200").json()
    assert owned["count"] >= 2
    assert {r["tenant"] for r in owned["results"]} == {"acme"}  # not globex, not tenant-less
    assert "g-job" not in str(owned)
    # Asking for the other tenant by name finds nothing, rather than its rows.
    assert api(history["acme_owner"]).get("/api/v1/audit/?tenant=globex").json()["count"] == 0


def test_members_viewers_and_strangers_are_refused(
    history: dict[str, Any], make_user: Any, acme: Tenant
) -> None:
    member = make_user("mia", acme, role=Role.MEMBER)
    viewer = make_user("vic", acme, role=Role.VIEWER)
    for user in (member, viewer, make_user("nobody")):
        assert api(user).get("/api/v1/audit/").status_code == 403
        assert session(user).get("/audit/").status_code == 403
        assert session(user).get("/audit/export.csv").status_code == 403
    assert APIClient().get("/api/v1/audit/").status_code in (401, 403)
    assert Client().get("/audit/").status_code == 302  # to the login page


def test_filters_actor_action_prefix_and_time(history: dict[str, Any], make_user: Any) -> None:
    client = api(make_user("root", staff=True))

    def actions(query: str) -> list[str]:
        response = client.get(f"/api/v1/audit/?{query}")
        assert response.status_code == 200, response.json()
        return [r["action"] for r in response.json()["results"]]

    assert actions("action=job.cancel") == ["job.cancel"]
    assert sorted(actions("action=job.")) == ["job.cancel", "job.submit", "job.submit"]
    assert set(actions("actor=globex-owner&action=job.")) == {"job.submit"}
    assert actions("tenant=globex&action=job.") == ["job.submit"]
    future = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert actions(f"since={future}") == []
    today = timezone.localdate().isoformat()
    assert "job.cancel" in actions(f"since={today}&until={today}")
    assert actions(f"until={(timezone.now() - timedelta(days=1)).date().isoformat()}") == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday", "since"),
        ("until=2026-13-45", "until"),
        ("since=2026-12-02&until=2026-12-01", "until"),
        ("actor=a%00b", "actor"),
        ("action=" + "x" * 51, "action"),
    ],
)
def test_bad_filters_are_a_400_that_says_which(
    history: dict[str, Any], make_user: Any, query: str, field: str
) -> None:
    admin = make_user("root", staff=True)
    response = api(admin).get(f"/api/v1/audit/?{query}")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    page = session(admin).get(f"/audit/?{query}")
    assert page.status_code == 400 and f'data-for="{field}"' in page.content.decode()
    assert session(admin).get(f"/audit/export.csv?{query}").status_code == 400


def test_the_api_paginates_like_the_other_lists(history: dict[str, Any], make_user: Any) -> None:
    client = api(make_user("root", staff=True))
    first = client.get("/api/v1/audit/?page_size=1").json()
    assert len(first["results"]) == 1 and first["next"] and first["count"] >= 4
    second = client.get(first["next"].replace("http://testserver", "")).json()
    assert second["results"][0]["id"] < first["results"][0]["id"]  # newest first
    row = first["results"][0]
    assert set(row) >= {"at", "actor_name", "via", "client_address", "tenant", "before", "after"}


def test_the_page_shows_an_owner_their_tenants_rows_with_filters_and_csv_link(
    history: dict[str, Any],
) -> None:
    client = session(history["acme_owner"])
    page = client.get("/audit/?action=job.cancel")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="audit-table"' in html and "job.cancel" in html and "job.submit" not in html
    assert "state</b>: queued → cancelled" in html
    assert " UTC</td>" in html  # the portal's time format
    assert 'href="/audit/export.csv?action=job.cancel"' in html
    everything = client.get("/audit/").content.decode()
    assert "a-job" in everything and "g-job" not in everything and "globex" not in everything
    assert '<a href="/audit/">Audit</a>' in everything


def test_the_nav_link_is_for_admins_and_owners_only(
    history: dict[str, Any], make_user: Any, acme: Tenant
) -> None:
    member = make_user("mia", acme)
    assert '<a href="/audit/">Audit</a>' not in session(member).get("/").content.decode()
    admin_home = session(make_user("root", staff=True)).get("/").content.decode()
    assert '<a href="/audit/">Audit</a>' in admin_home


def read_csv(response: Any) -> list[list[str]]:
    assert response["Content-Type"] == "text/csv"
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_the_csv_export_is_filtered_scoped_and_safe_in_a_spreadsheet(
    history: dict[str, Any], acme: Tenant, globex: Tenant
) -> None:
    with transaction.atomic():  # a hostile object name, as a person could type it
        record("job.update", tenant=acme, object_type="jobs.job", object_repr="=HYPERLINK(evil)")
        record("job.update", tenant=globex, object_type="jobs.job", object_repr="secret-of-globex")
    client = session(history["acme_owner"])
    rows = read_csv(client.get("/audit/export.csv"))
    header, body = rows[0], rows[1:]
    assert header[:3] == ["at", "actor", "actor_id"] and header[-2:] == ["before", "after"]
    tenants = {line[header.index("tenant")] for line in body}
    assert tenants == {"acme"}
    objects = [line[header.index("object")] for line in body]
    assert "'=HYPERLINK(evil)" in objects and "secret-of-globex" not in str(rows)
    only_cancel = read_csv(client.get("/audit/export.csv?action=job.cancel"))[1:]
    assert [line[header.index("action")] for line in only_cancel] == ["job.cancel"]


def test_the_csv_export_is_bounded(
    history: dict[str, Any], make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_views, "EXPORT_MAX_ROWS", 2)
    response = session(make_user("root", staff=True)).get("/audit/export.csv")
    total = AuditEntry.objects.count()
    assert response["X-Audit-Rows"] == "2" and response["X-Audit-Truncated"] == str(total)
    rows = read_csv(response)
    assert (
        len(rows) == 1 + 2 + 1 and rows[-1][0] == f"# cut at 2 of {total} rows: narrow the filters"
    )
