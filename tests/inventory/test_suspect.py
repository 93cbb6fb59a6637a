"""Suspect GPUs: the control plane marks one, an admin clears it (audited), nobody else may.

Services against the real database; the API and the pages through Django's
real request stack.  The tick's side (no new placement on a suspect GPU) is in
``tests/jobs/test_tick_suspect.py``; the straggler report's in
``tests/jobs/test_stragglers.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from inventory.models import Gpu
from inventory.services import (
    InventoryError,
    do_clear_gpu_suspect,
    do_mark_gpu_suspect,
    suspect_gpus,
)
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db


def mark(gpu: int, seconds: float = 600, **extra: Any) -> Gpu | None:
    fields = {"reason": "straggler: worker w3 of job 7 was 1.60x slower", "job_id": 7, "by": "test"}
    return do_mark_gpu_suspect(gpu=gpu, at=timezone.now(), seconds=seconds, **{**fields, **extra})


def test_a_mark_says_who_why_until_and_which_job_and_is_never_shortened() -> None:
    demo_cluster()
    first = mark(3, seconds=600)
    assert first is not None and first.suspect_until is not None
    (listed,) = suspect_gpus()
    assert (listed.index, listed.node, listed.job_id, listed.by) == (3, "node-1", 7, "test")
    assert listed.until == first.suspect_until and "1.60x slower" in listed.reason
    shorter = mark(3, seconds=60, job_id=8)
    assert shorter is not None and shorter.suspect_until == first.suspect_until
    assert shorter.suspect_job == 8  # the latest report's job and reason
    longer = mark(3, seconds=1200)
    assert longer is not None and longer.suspect_until is not None
    assert longer.suspect_until > first.suspect_until
    assert not AuditEntry.objects.filter(action__startswith="gpu.").exists()  # the system's


@pytest.mark.parametrize("gpu, seconds", [(99, 600), (3, 0), (3, -5)])
def test_no_mark_for_an_unknown_gpu_or_no_cool_down(gpu: int, seconds: float) -> None:
    demo_cluster()
    assert mark(gpu, seconds=seconds) is None
    assert suspect_gpus() == [] and not Gpu.objects.exclude(suspect_until=None).exists()


def test_a_lapsed_mark_is_not_suspect_and_cannot_be_cleared() -> None:
    demo_cluster()
    mark(3)
    Gpu.objects.filter(index=3).update(suspect_until=timezone.now() - timedelta(seconds=1))
    assert suspect_gpus() == []
    with pytest.raises(InventoryError, match="GPU 3 is not suspect"):
        do_clear_gpu_suspect(gpu=3)


def test_clearing_is_audited_with_the_mark_before(make_user: Callable[..., Any]) -> None:
    demo_cluster()
    mark(3)
    root = make_user("root", staff=True)
    do_clear_gpu_suspect(gpu=3, user=root)
    assert suspect_gpus() == []
    entry = AuditEntry.objects.get(action="gpu.clear_suspect")
    assert entry.actor_name == "root" and entry.object_type == "inventory.gpu"
    assert entry.before["suspect_job"] == 7 and entry.before["suspect_until"]
    assert entry.after == {**dict.fromkeys(entry.before), "suspect_reason": "", "suspect_by": ""}
    with pytest.raises(InventoryError, match="not suspect"):  # twice: refused, no second row
        do_clear_gpu_suspect(gpu=3, user=root)
    with pytest.raises(InventoryError, match="no GPU 99"):
        do_clear_gpu_suspect(gpu=99, user=root)
    assert AuditEntry.objects.filter(action="gpu.clear_suspect").count() == 1


# --------------------------------------------------------------------------- the API


@pytest.fixture
def admin_api(make_user: Callable[..., Any], token_client: Callable[[Any], APIClient]) -> APIClient:
    return token_client(make_user("root", staff=True))


def test_the_api_lists_and_clears_marks_for_admins(admin_api: APIClient) -> None:
    demo_cluster()
    mark(3)
    listed = admin_api.get("/api/v1/gpus/suspect/")
    assert listed.status_code == 200
    (row,) = listed.json()
    assert (row["gpu"], row["node"], row["local"], row["job"]) == (3, "node-1", 1, 7)
    assert row["until"] and "1.60x" in row["reason"]
    assert admin_api.delete("/api/v1/gpus/3/suspect/").status_code == 204
    assert admin_api.get("/api/v1/gpus/suspect/").json() == []
    again = admin_api.delete("/api/v1/gpus/3/suspect/")
    assert again.status_code == 409 and "not suspect" in again.json()["message"]
    missing = admin_api.delete("/api/v1/gpus/99/suspect/")
    assert missing.status_code == 404 and missing.json()["message"] == "Not found."


def test_tenants_and_strangers_can_neither_read_nor_clear(
    alice: Any, token_client: Callable[[Any], APIClient]
) -> None:
    demo_cluster()
    mark(3)
    member = token_client(alice)
    assert member.get("/api/v1/gpus/suspect/").status_code == 403
    refused = member.delete("/api/v1/gpus/3/suspect/")
    assert refused.status_code == 403 and "cluster admin" in refused.json()["message"]
    anonymous = APIClient()
    assert anonymous.get("/api/v1/gpus/suspect/").status_code in (401, 403)
    assert anonymous.delete("/api/v1/gpus/3/suspect/").status_code in (401, 403)
    assert [m.index for m in suspect_gpus()] == [3]  # nothing changed
    assert not AuditEntry.objects.filter(action="gpu.clear_suspect").exists()


# --------------------------------------------------------------------------- the pages


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


def test_the_topology_page_lists_marks_and_clears_one(admin: Client) -> None:
    demo_cluster()
    assert b"No GPU is suspect." in admin.get("/cluster/topology/").content
    mark(3)
    page = admin.get("/cluster/topology/").content.decode()
    assert 'id="suspect-3"' in page and "1.60x slower" in page and "/jobs/7/" in page
    response = admin.post("/cluster/topology/gpus/3/clear-suspect/", follow=True)
    assert b"GPU 3 is no longer suspect" in response.content
    assert suspect_gpus() == []
    refused = admin.post("/cluster/topology/gpus/3/clear-suspect/", follow=True)
    assert b"GPU 3 is not suspect" in refused.content


def test_the_clear_button_is_404_for_tenants(alice: Any) -> None:
    demo_cluster()
    mark(3)
    client = Client()
    client.force_login(alice)
    assert client.post("/cluster/topology/gpus/3/clear-suspect/").status_code == 404
    assert [m.index for m in suspect_gpus()] == [3]


def test_the_cluster_data_carries_the_marks(admin: Client) -> None:
    demo_cluster()
    mark(5)
    data = json.loads(admin.get("/live/cluster.json").content)
    (row,) = data["suspect"]
    assert (row["gpu"], row["job"]) == (5, 7) and row["until"]
