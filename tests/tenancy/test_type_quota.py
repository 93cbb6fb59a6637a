"""A tenant's quota per GPU type and its CPU/memory request defaults (issue 38): set by an
admin through the API, the settings page and Django admin, checked (a 400 naming the field,
nothing changed), shown to its members."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Any:
    return make_user("root", staff=True)


def test_an_admin_sets_a_quota_per_type_and_request_defaults(
    admin: Any, acme: Tenant, token_client: Callable[[Any], APIClient]
) -> None:
    client = token_client(admin)
    body = {"gpu_type_quota": {"h100-80g": 4, "a100-40g": 0}, "default_cpus_per_gpu": 8,
            "default_mem_per_gpu_mib": 32768}  # fmt: skip
    changed = client.patch("/api/v1/tenants/acme/", body, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["gpu_type_quota"] == {"h100-80g": 4, "a100-40g": 0}
    acme.refresh_from_db()
    assert (acme.default_cpus_per_gpu, acme.default_mem_per_gpu_mib) == (8, 32768)
    cleared = client.patch("/api/v1/tenants/acme/", {"gpu_type_quota": {}}, format="json")
    assert cleared.status_code == 200 and cleared.json()["gpu_type_quota"] == {}


@pytest.mark.parametrize(
    "quota",
    [
        {"H100!": 4},
        {"h100-80g": -1},
        {"h100-80g": "four"},
        {"h100-80g": True},
        {"h100-80g": 2.5},
        {f"t{i}": 1 for i in range(40)},
        ["h100-80g"],
    ],
)
def test_a_bad_quota_per_type_is_a_400_naming_it_that_changes_nothing(
    admin: Any, acme: Tenant, token_client: Callable[[Any], APIClient], quota: Any
) -> None:
    answer = token_client(admin).patch(
        "/api/v1/tenants/acme/", {"gpu_type_quota": quota}, format="json"
    )
    assert answer.status_code == 400, answer.content[:300]
    assert "gpu_type_quota" in answer.content.decode()
    acme.refresh_from_db()
    assert acme.gpu_type_quota == {}


def test_members_may_not_set_it(
    alice: Any, acme: Tenant, token_client: Callable[[Any], APIClient]
) -> None:
    answer = token_client(alice).patch(
        "/api/v1/tenants/acme/", {"gpu_type_quota": {"h100-80g": 99}}, format="json"
    )
    assert answer.status_code in (403, 404)
    acme.refresh_from_db()
    assert acme.gpu_type_quota == {}


def test_the_settings_page_takes_a_quota_per_type_as_json(admin: Any, acme: Tenant) -> None:
    page = Client()
    page.force_login(admin)
    form = page.get("/tenants/acme/settings/").context["form"]
    data = {name: ("" if value is None else value) for name, value in form.initial.items()}
    data = {k: ("on" if v is True else v) for k, v in data.items() if v is not False}
    data["gpu_type_quota"] = '{"h100-80g": 2}'
    saved = page.post("/tenants/acme/settings/", data)
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    acme.refresh_from_db()
    assert acme.gpu_type_quota == {"h100-80g": 2}
    data["gpu_type_quota"] = '{"h100-80g": -2}'
    refused = page.post("/tenants/acme/settings/", data)
    assert refused.status_code == 400 and "gpu_type_quota" in refused.content.decode()
    acme.refresh_from_db()
    assert acme.gpu_type_quota == {"h100-80g": 2}
