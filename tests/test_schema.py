"""The OpenAPI schema lists every endpoint; the docs page works offline."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db


def _api_routes(patterns: list[Any], prefix: str = "") -> set[str]:
    routes: set[str] = set()
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            routes |= _api_routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and route.startswith("api/v1/"):
            routes.add(route)
    return routes


def _normalise(route: str) -> str:
    """Django route or regex → the OpenAPI path form (/api/v1/jobs/{id}/)."""
    import re

    route = route.replace("^", "").replace("$", "").replace("\\.", ".")
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
    route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
    return "/" + route


def test_every_api_route_is_in_the_schema(client: Client) -> None:
    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    paths = set(schema["paths"])
    expected = {
        _normalise(r).replace("{pk}", "{id}")
        for r in _api_routes(get_resolver().url_patterns)
        if "format" not in r and r != "api/v1/"
    }
    # DRF's router names the lookup {id} for ints; normalise both sides the same way.
    paths = {p.replace("{pk}", "{id}") for p in paths}
    missing = {p for p in expected if p not in paths}
    assert not missing, missing
    for path in [
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/jobs/{id}/events/",
        "/api/v1/tenants/",
        "/api/v1/tenants/{slug}/",
        "/api/v1/me/",
        "/api/v1/stats/jct/",
    ]:
        assert path in paths
    assert set(schema["paths"]["/api/v1/jobs/"]) >= {"get", "post"}
    assert "patch" in schema["paths"]["/api/v1/jobs/{id}/"]


def test_swagger_ui_is_served_locally(client: Client) -> None:
    page = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in page
    assert "cdn" not in page.lower() and "unpkg" not in page.lower()
    asset = [part.split('"')[0] for part in page.split('src="')[1:]]
    # the start-up script comes from the page's own URL (no inline script: CSP)
    local = ("/static/", "/api/docs/?script")
    assert asset and all(src.startswith(local) for src in asset), asset


def test_every_operation_has_a_summary_swagger_ui_lists(client: Client) -> None:
    schema = yaml.safe_load(client.get("/api/schema/").content)
    operations = [
        (method, path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]
    unsummarised = [f"{m} {p}" for m, p, op in operations if not op.get("summary")]
    assert not unsummarised, f"add them to portal/api/summaries.py: {unsummarised}"
    summaries = [op["summary"] for _m, _p, op in operations]
    assert len(set(summaries)) == len(summaries)  # each line tells its operation apart
