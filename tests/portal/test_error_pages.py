"""Refusals look like the portal (its header, a way back) or are JSON for JSON callers.

Also under DEBUG, as ``make run`` serves: Django's technical 404 lists every URL pattern.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory

from jobs.errors import JobConflictError
from jobs.models import Job
from portal.error_views import ErrorPagesMiddleware, server_error

pytestmark = pytest.mark.django_db

ADMIN_PAGES = ("/cluster/", "/cluster/topology/", "/whatif/")
JSON_ENDPOINTS = ("/live/cluster.json", "/cluster/topology/export.json", "/api/v1/no-such/")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def assert_portal_page(response: Any, status: int) -> str:
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/html")
    body = response.content.decode()
    assert 'class="topbar"' in body and 'href="/"' in body, "no portal header or way back"
    assert f'data-status="{status}"' in body
    assert "urlpatterns" not in body and "URLconf" not in body, "the URL map leaked"
    return body


@pytest.mark.parametrize("debug", [False, True])
def test_a_tenant_on_an_admin_page_gets_the_portals_404(
    alice: Any, settings: Any, debug: bool
) -> None:
    settings.DEBUG = debug
    client = logged_in(alice)
    for url in (*ADMIN_PAGES, "/no-such-page/", "/jobs/999999/"):
        body = assert_portal_page(client.get(url), 404)
        assert "Log out" in body, "the header should be the signed-in one"


@pytest.mark.parametrize("debug", [False, True])
def test_json_endpoints_answer_json(alice: Any, settings: Any, debug: bool) -> None:
    settings.DEBUG = debug
    client = logged_in(alice)
    for url in JSON_ENDPOINTS:
        response = client.get(url)
        assert response.status_code == 404, url
        assert response["Content-Type"] == "application/json", url
        assert json.loads(response.content) == {"message": "Not found.", "errors": {}}


def test_accept_json_gets_json_on_a_page_url(alice: Any) -> None:
    response = logged_in(alice).get("/cluster/", HTTP_ACCEPT="application/json")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"


def test_debug_keeps_append_slash(alice: Any, settings: Any) -> None:
    settings.DEBUG = True
    response = logged_in(alice).get("/jobs/new")
    assert response.status_code == 301 and response["Location"] == "/jobs/new/"


def test_a_stale_form_is_the_portals_403_and_changes_nothing(alice: Any, acme: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post("/jobs/new/", {"tenant": acme.pk, "name": "x", "gpus": 1})
    body = assert_portal_page(response, 403)
    assert "expired" in body
    assert not Job.objects.exists()


def conflicting_view(request: HttpRequest) -> HttpResponse:
    raise JobConflictError("Job 7 is already completed.")


@pytest.mark.parametrize(("path", "json_answer"), [("/jobs/7/x/", False), ("/jobs/7.json", True)])
def test_a_conflict_escaping_a_page_is_a_409_with_its_message(
    alice: Any, path: str, json_answer: bool
) -> None:
    request = RequestFactory().post(path)
    request.user = alice
    response = ErrorPagesMiddleware(conflicting_view).process_exception(
        request, JobConflictError("Job 7 is already completed.")
    )
    assert response is not None and response.status_code == 409
    if json_answer:
        assert json.loads(response.content)["message"] == "Job 7 is already completed."
    else:
        assert "Job 7 is already completed." in assert_portal_page(response, 409)


def test_the_500_page_needs_no_database_and_markup_is_text(alice: Any) -> None:
    page = server_error(RequestFactory().get("/"))
    assert page.status_code == 500 and 'class="topbar"' in page.content.decode()
    api = server_error(RequestFactory().get("/api/v1/jobs/"))
    assert json.loads(api.content) == {"message": "Internal server error.", "errors": {}}


def test_an_error_message_is_escaped(alice: Any) -> None:
    request = RequestFactory().post("/jobs/7/cancel/")
    request.user = alice
    response = ErrorPagesMiddleware(conflicting_view).process_exception(
        request, JobConflictError("<script>alert(1)</script>")
    )
    assert response is not None
    body = response.content.decode()
    assert "<script>alert(1)" not in body and "&lt;script&gt;" in body
