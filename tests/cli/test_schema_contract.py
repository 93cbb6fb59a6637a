"""Every endpoint the client calls, and every field it reads or sends, is in /api/schema/."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from django.test import Client as DjangoClient

from portalctl import client as api
from portalctl.jobfile import JOB_FILE_FIELDS

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client: DjangoClient) -> dict[str, Any]:
    response = client.get("/api/schema/")
    assert response.status_code == 200
    return dict(yaml.safe_load(response.content))


def properties(schema: dict[str, Any], component: str) -> set[str]:
    return set(schema["components"]["schemas"][component]["properties"])


def request_fields(
    schema: dict[str, Any], method: str, path: str, media: str = "application/json"
) -> set[str]:
    """The properties of an operation's request body."""
    body = schema["paths"][path][method]["requestBody"]["content"][media]["schema"]
    return properties(schema, body["$ref"].rsplit("/", 1)[1])


def test_every_endpoint_the_client_calls_is_in_the_schema(schema: dict[str, Any]) -> None:
    paths = {path.replace("{pk}", "{id}"): ops for path, ops in schema["paths"].items()}
    missing = [
        f"{method} {path}"
        for method, path in api.ENDPOINTS
        if method.lower() not in paths.get(path, {})
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    ("result", "component"),
    [
        (api.Job, "Job"),
        (api.JobEvent, "JobEvent"),
        (api.LogLine, "LogLine"),
        (api.Artifact, "Artifact"),
        (api.Bundle, "CodeBundle"),
        (api.Tenant, "Tenant"),
    ],
)
def test_every_field_the_client_reads_is_in_the_schema(
    schema: dict[str, Any], result: type, component: str
) -> None:
    fields = {f.name for f in dataclasses.fields(result)} - {"raw"}
    assert fields - properties(schema, component) == set()


def test_a_job_file_and_the_client_send_only_fields_the_schema_has(
    schema: dict[str, Any],
) -> None:
    assert set(JOB_FILE_FIELDS) == request_fields(schema, "post", "/api/v1/jobs/")
    scaled = request_fields(schema, "patch", "/api/v1/jobs/{id}/")
    assert {"min_gpus", "max_gpus", "priority"} <= scaled
    assert "reason" in request_fields(schema, "post", "/api/v1/jobs/{id}/cancel/")
    upload = request_fields(schema, "post", "/api/v1/code/", "multipart/form-data")
    assert {"archive", "tenant"} <= upload
    logs = schema["paths"]["/api/v1/jobs/{id}/logs/"]["get"]["parameters"]
    assert {"tail", "since", "worker", "follow"} <= {p["name"] for p in logs}
