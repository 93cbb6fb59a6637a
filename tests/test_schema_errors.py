"""The OpenAPI schema documents each operation's error responses, in the API's error shape."""

from __future__ import annotations

import pytest
import yaml
from django.test import Client

pytestmark = pytest.mark.django_db


def test_every_operation_documents_its_error_responses(client: Client) -> None:
    """401/403/429 everywhere, 400/404/409/413 where they can occur, all in the error shape."""
    schema = yaml.safe_load(client.get("/api/schema/").content)
    error = schema["components"]["schemas"]["ApiError"]
    assert set(error["required"]) == {"message", "errors"}
    write = {"post", "put", "patch", "delete"}
    checked = 0
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in write | {"get"}:
                continue
            codes = set(operation["responses"])
            expected = {"401", "403", "429"}
            if "requestBody" in operation:
                expected |= {"400", "413"}
            if method in write:
                expected.add("409")
            if operation.get("parameters"):
                expected |= {"400", "404"}
            assert expected <= codes, (method, path, sorted(expected - codes))
            checked += 1
    assert checked >= 15
    cancel = schema["paths"]["/api/v1/jobs/{id}/cancel/"]["post"]["responses"]
    assert cancel["413"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ApiError"
    }
    reason = schema["components"]["schemas"]["JobCancelRequest"]["properties"]["reason"]
    assert reason["maxLength"] == 200
