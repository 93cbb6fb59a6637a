"""Hostile input is a JSON 400/413 naming the field (or a form error at the field), never a 500,
and it changes nothing in the database (issue 16, item 3; the topology bound of item 6)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from inventory.models import Fabric, Server
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from tests.conftest import job_body

pytestmark = pytest.mark.django_db

DEEP = "[" * 5000
"""The probe that made the API answer 500 RecursionError."""


@pytest.fixture
def api(token_client: Callable[[Any], APIClient], alice: Any) -> APIClient:
    """alice's token client (acme, quota 8)."""
    return token_client(alice)


@pytest.fixture
def queued(api: APIClient) -> Job:
    """One queued job of alice's."""
    response = api.post("/api/v1/jobs/", job_body(), format="json")
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def raw(client: APIClient, method: str, url: str, body: str | bytes) -> Any:
    """Send ``body`` as it is, labelled JSON."""
    return client.generic(method, url, body, content_type="application/json")


def assert_refused(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """A JSON error of ``status`` in the API's shape, naming ``field`` when given."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert set(body) == {"message", "errors"} and body["message"]
    if field is not None:
        assert field in body["errors"], body
    return body


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_deeply_nested_body_is_a_400(api: APIClient, queued: Job, method: str) -> None:
    url = "/api/v1/jobs/" if method == "POST" else f"/api/v1/jobs/{queued.pk}/"
    body = assert_refused(raw(api, method, url, DEEP), 400)
    assert "Nested" in body["message"]
    assert Job.objects.count() == 1
    queued.refresh_from_db()
    assert (queued.priority, queued.min_gpus, queued.max_gpus) == (50, 2, 2)


def test_nested_args_are_a_400_on_args(api: APIClient) -> None:
    """``args`` as JSON text: the service parsed it with no bound (RecursionError, a 500)."""
    body = json.dumps(job_body(args=DEEP))
    assert_refused(raw(api, "POST", "/api/v1/jobs/", body), 400, "args")
    deep_value = '{"name": "x", "workload": "mlp-digits", "gpus": 2, "args": ' + DEEP
    assert_refused(raw(api, "POST", "/api/v1/jobs/", deep_value), 400, "args")
    assert Job.objects.count() == 0


def test_nested_env_text_is_a_400_on_env(api: APIClient) -> None:
    """``env`` as JSON text (what the form sends) was parsed with no bound as well."""
    body = {"name": "x", "code": "a" * 64, "entrypoint": "t.py", "env": '{"A": ' + DEEP, "gpus": 1}
    assert_refused(api.post("/api/v1/jobs/", body, format="json"), 400, "env")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"name": "x", "workload": "mlp-digits", "gpus": 1e400}', "gpus"),  # OverflowError
        ('{"name": "x", "workload": "mlp-digits", "gpus": 2, "tenant": "ac\\u0000me"}', "tenant"),
        ('{"name": "x", "workload": "mlp-digits", "gpus": 2, "tenant": ["acme"]}', "tenant"),
        ('{"name": "x", "workload": "mlp-digits", "gpus": 2, "tenant": {"a": 1}}', "tenant"),
    ],
    ids=["inf", "nul-tenant", "list-tenant", "object-tenant"],
)
def test_wild_values_in_a_submission_are_a_400(api: APIClient, body: str, field: str) -> None:
    assert_refused(raw(api, "POST", "/api/v1/jobs/", body), 400, field)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "reason", [123, ["x"], {"a": "b"}, True, "x" * 5000], ids=["int", "list", "obj", "bool", "long"]
)
def test_a_cancel_reason_must_be_a_short_string(api: APIClient, queued: Job, reason: Any) -> None:
    response = api.post(f"/api/v1/jobs/{queued.pk}/cancel/", {"reason": reason}, format="json")
    assert_refused(response, 400, "reason")
    queued.refresh_from_db()
    assert queued.state == JobState.QUEUED
    assert not JobEvent.objects.filter(job=queued, to_state=JobState.CANCELLED).exists()
    response = api.post(f"/api/v1/jobs/{queued.pk}/cancel/", {"reason": "done"}, format="json")
    assert response.status_code == 200, response.json()
    assert JobEvent.objects.filter(job=queued, to_state=JobState.CANCELLED).get().reason == "done"


def test_a_body_over_the_limit_is_a_json_413(api: APIClient, settings: Any) -> None:
    settings.API_MAX_JSON_BYTES = 1000
    body = json.dumps(job_body(name="x" * 2000))
    assert_refused(raw(api, "POST", "/api/v1/jobs/", body), 413)
    assert Job.objects.count() == 0


def test_a_body_over_django_s_own_limit_is_a_json_413(api: APIClient, settings: Any) -> None:
    """Past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` in a multipart form (the code upload): JSON 413,
    not Django's HTML 400 page."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/api/v1/code/", {"tenant": "x" * 5000}, format="multipart")
    assert_refused(response, 413)


def test_nul_in_a_query_or_path_is_a_400_not_a_500(api: APIClient, queued: Job) -> None:
    assert_refused(api.get("/api/v1/jobs/?tenant=a%00b"), 400, "tenant")
    assert_refused(api.get("/api/v1/jobs/?workload=a%00b"), 400, "workload")
    assert_refused(api.get("/api/v1/stats/jct/?tenant=a%00b"), 400, "tenant")
    assert api.get("/api/v1/tenants/a%00b/").status_code in (400, 404)


def submit_form(**overrides: str) -> dict[str, str]:
    form = {
        "tenant": "acme",
        "name": "x",
        "workload": "mlp-digits",
        "gpus": "1",
        "priority": "1",
        "recovery": "consistent",
        "checkpoint_interval": "1",
    }
    form.update(overrides)
    return form


def test_the_submit_form_puts_nested_args_at_the_field(alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    page = client.post("/jobs/new/", submit_form(args=DEEP))
    assert page.status_code == 200
    assert b'data-for="args"' in page.content
    assert Job.objects.count() == 0


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


@pytest.mark.parametrize(
    "document",
    [
        DEEP,
        # Each is a valid fabric that main would build, row by row (or run out of memory on).
        json.dumps({**SPEC, "leaves": 600, "servers_per_leaf": 1}),
        json.dumps({**SPEC, "gpus_per_server": 32}),
        json.dumps({**SPEC, "spines": 1024, "servers_per_leaf": 64, "gpus_per_server": 16}),
        json.dumps({**SPEC, "leaves": 100, "servers_per_leaf": 64}),  # 6400 servers
    ],
    ids=["deep", "huge", "gpus", "spines", "servers"],
)
def test_topology_import_is_bounded(admin: Client, document: str) -> None:
    page = admin.post("/cluster/topology/", {"form": "import", "document": document})
    assert page.status_code == 400
    assert page.context["importer"].errors["document"]
    assert not Fabric.objects.exists() and not Server.objects.exists()


def test_topology_import_over_the_document_size_is_refused(admin: Client, settings: Any) -> None:
    settings.TOPOLOGY_MAX_BYTES = 100
    document = json.dumps({**SPEC, "servers": [{"leaf": 0, "slot": 0, "node": "n" * 60}] * 3})
    page = admin.post("/cluster/topology/", {"form": "import", "document": document})
    assert page.status_code == 400
    assert "limit" in str(page.context["importer"].errors["document"])
    assert not Fabric.objects.exists()


def test_topology_generator_is_bounded_by_total_servers(admin: Client) -> None:
    page = admin.post(
        "/cluster/topology/",
        {"form": "generate", **SPEC, "leaves": 100, "servers_per_leaf": 64, "link_gbps": "100"},
    )
    assert page.status_code == 400
    assert page.context["generator"].errors
    assert not Server.objects.exists()


def test_a_server_action_on_a_nul_name_is_a_404(admin: Client) -> None:
    assert admin.post("/cluster/topology/servers/a%00b/drain/").status_code == 404


def test_loadtopology_refuses_deep_and_huge_documents(tmp_path: Path) -> None:
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("[" * 5000)
    deep_json = tmp_path / "deep.json"
    deep_json.write_text(DEEP)
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**SPEC, "leaves": 600, "servers_per_leaf": 1}))
    for path in (deep_yaml, deep_json, huge):
        with pytest.raises(CommandError):
            call_command("loadtopology", str(path))
    assert not Server.objects.exists()


def test_a_code_upload_with_a_malformed_length_is_a_400(api: APIClient) -> None:
    response = api.post("/api/v1/code/", {}, format="multipart", CONTENT_LENGTH="12abc")
    assert_refused(response, 400)
