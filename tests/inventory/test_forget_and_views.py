"""What the operator does with pending servers (forget, and see one come back) and what the
cluster view shows: per-type utilization on the two-type demo cluster, pools, pending
servers and health in the snapshot the page redraws from, the events that keep it live.

Reports go through the real signed path (``tests.inventory.test_registration.beat``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from control.tick import run_tick
from inventory import registration
from inventory.models import PendingServer, Server
from inventory.registration import do_forget_pending_server
from inventory.services import InventoryError
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.cluster_data import cluster_snapshot, type_colours
from portal.demo import two_type_fabric
from tests.inventory.test_registration import beat, empty_fabric
from tests.jobs.control_helpers import demo_cluster
from utilities import realtime
from workers.tests.fake_nvml import FakeNvml, fake_gpus

pytestmark = pytest.mark.django_db

A100, H100 = "a100-40g", "h100-80g"


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("root", staff=True))
    return client


def listed(admin: APIClient) -> dict[str, dict[str, Any]]:
    answer = admin.get("/api/v1/servers/pending/")
    assert answer.status_code == 200
    return {row["node"]: row for row in answer.json()}


def test_forget_hides_a_pending_server_and_a_report_brings_it_back_saying_so(
    admin: APIClient,
) -> None:
    empty_fabric()
    nvml = FakeNvml(fake_gpus("stray", 2))
    beat("stray", nvml)
    beat("other", FakeNvml(fake_gpus("other", 2)))
    pending = PendingServer.objects.get(node="stray")
    assert listed(admin)["stray"]["note"] == ""

    answer = admin.post(f"/api/v1/servers/pending/{pending.pk}/forget/")
    assert answer.status_code == 204, answer.content
    assert set(listed(admin)) == {"other"}
    [entry] = AuditEntry.objects.filter(action="server.forget")
    assert entry.object_repr == "stray (pending)" and entry.actor_name == "root"
    assert entry.before["forgotten_at"] is None and entry.after["forgotten_by"] == "root"
    # Forgotten and silent: as missing as one that never was, for forget and accept alike.
    assert admin.post(f"/api/v1/servers/pending/{pending.pk}/forget/").status_code == 404
    accept = admin.post(f"/api/v1/servers/{pending.pk}/accept/", {"leaf": 0}, format="json")
    assert accept.status_code == 404
    assert AuditEntry.objects.filter(action="server.forget").count() == 1
    assert not Server.objects.exists()

    assert beat("stray", nvml) == "unknown node"  # its agent still runs: it comes back
    back = listed(admin)["stray"]
    assert back["id"] == pending.pk and back["forgotten_by"] == "root"
    assert back["note"].startswith("forgotten by root at ") and "reported again" in back["note"]
    again = admin.post(f"/api/v1/servers/{pending.pk}/accept/", {"leaf": 1}, format="json")
    assert again.status_code == 200, again.content
    assert Server.objects.get(node="stray").leaf == 1


def test_forgetting_a_missing_id_is_a_404_and_a_non_admin_may_not(
    admin: APIClient, make_user: Callable[..., Any]
) -> None:
    empty_fabric()
    beat("kept", FakeNvml(fake_gpus("kept", 2)))
    pending = PendingServer.objects.get()
    assert admin.post("/api/v1/servers/pending/99999/forget/").status_code == 404
    someone = APIClient()
    someone.force_authenticate(make_user("bob"))
    assert someone.post(f"/api/v1/servers/pending/{pending.pk}/forget/").status_code == 403
    with pytest.raises(InventoryError, match="integer id"):
        do_forget_pending_server(pending="1")
    pending.refresh_from_db()
    assert pending.forgotten_at is None and set(listed(admin)) == {"kept"}
    assert not AuditEntry.objects.filter(action="server.forget").exists()


def test_the_editor_forgets_and_says_404_for_a_missing_one(make_user: Callable[..., Any]) -> None:
    empty_fabric()
    beat("edit-me", FakeNvml(fake_gpus("edit-me", 2)))
    pending = PendingServer.objects.get()
    page = Client()
    page.force_login(make_user("root4", staff=True))
    html = page.get("/cluster/topology/").content.decode()
    assert 'id="pending-edit-me"' in html and 'name="form" value="forget"' in html
    assert page.post("/cluster/topology/", {"form": "forget", "pending": "x"}).status_code == 404
    assert page.post("/cluster/topology/", {"form": "forget", "pending": "999"}).status_code == 404
    assert PendingServer.listed().filter(pk=pending.pk).exists()
    done = page.post("/cluster/topology/", {"form": "forget", "pending": pending.pk})
    assert done.status_code == 302
    assert 'id="pending-edit-me"' not in page.get("/cluster/topology/").content.decode()
    assert AuditEntry.objects.get(action="server.forget").actor_name == "root4"


def test_forgotten_silent_rows_make_room_when_the_table_is_full(
    admin: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registration, "MAX_PENDING_SERVERS", 2)
    empty_fabric()
    beat("p1", None)
    beat("p2", None)
    beat("p3", None)  # full: dropped
    assert set(listed(admin)) == {"p1", "p2"}
    do_forget_pending_server(pending=PendingServer.objects.get(node="p1").pk)
    beat("p3", None)  # the forgotten, silent p1 makes room
    assert set(listed(admin)) == {"p2", "p3"}
    assert not PendingServer.objects.filter(node="p1").exists()


def test_a_server_of_another_gpu_count_is_refused_naming_both_counts(admin: APIClient) -> None:
    empty_fabric()
    beat("big", FakeNvml(fake_gpus("big", 8)))
    pending = PendingServer.objects.get()
    answer = admin.post(f"/api/v1/servers/{pending.pk}/accept/", {"leaf": 0}, format="json")
    assert answer.status_code == 400
    [message] = answer.json()["errors"]["pending"]
    assert "big reports 8 GPUs but every server of this fabric has 2" in message
    assert "one GPU count" in message
    assert not Server.objects.exists() and PendingServer.listed().count() == 1


def _submit(user: Any, tenant: Any, **fields: Any) -> Job:
    data = {"name": "t", "workload": "mlp-digits", "gpus": 2, **fields}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@pytest.mark.django_db(transaction=True)
def test_the_two_type_cluster_shows_utilization_pools_and_pending_per_type(
    alice: Any, acme: Any
) -> None:
    """Two H100 jobs on the two-type demo cluster: H100s 100 % in use, A100s idle, in the
    table's data and in the per-type timeline; pools and pending servers come with it."""
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    jobs = [_submit(alice, acme, gpus=2, max_gpus=2, gpu_types=[H100]) for _ in range(2)]
    run_tick(policy="fifo")
    for job in jobs:
        job.refresh_from_db()
        assert job.state == "running" and job.ran_on_type == H100
    beat("newcomer", FakeNvml(fake_gpus("newcomer", 2)))

    snap = cluster_snapshot("1h")
    assert snap["types"] == {A100: {"gpus": 4, "allocated": 0}, H100: {"gpus": 4, "allocated": 4}}
    series = snap["timeline"]["utilization_by_type"]
    assert set(series) == {A100, H100}
    assert series[H100][-1] == 1.0 and series[A100][-1] == 0.0
    assert series[H100][0] == 0.0  # the window opened before the jobs started
    pools = {p["pool"]: p for p in snap["pools"]}
    assert pools["train"]["types"] == [A100, H100] and pools["train"]["gpus"] == 4
    assert pools["train"]["allocated"] + pools["interactive"]["allocated"] == 4
    assert [p["node"] for p in snap["pending"]] == ["newcomer"]
    assert snap["type_colours"] == type_colours([A100, H100])
    assert snap["type_colours"][A100] != snap["type_colours"][H100]


def test_a_change_of_health_word_is_broadcast_and_a_steady_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, Any]] = []
    real = realtime.broadcast_on_commit

    def recording(groups: Iterable[str], payload: dict[str, Any], **kw: Any) -> None:
        sent.append(payload)
        real(groups, payload, **kw)

    monkeypatch.setattr(registration, "broadcast_on_commit", recording)
    node = demo_cluster({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})[0]
    nvml = FakeNvml(fake_gpus(node, 2))
    beat(node, nvml)  # not reported -> ok
    beat(node, nvml)  # ok -> ok: nothing
    nvml.gpus[0].temperature_c = 99
    beat(node, nvml)  # ok -> unhealthy
    health = [p for p in sent if p["type"] == "server.health"]
    assert health == [
        {"type": "server.health", "node": node, "health": "ok"},
        {"type": "server.health", "node": node, "health": "unhealthy"},
    ]


def test_a_server_added_by_hand_has_its_type_and_pool_and_leaves_pending(
    make_user: Callable[..., Any],
) -> None:
    empty_fabric()
    beat("by-hand", FakeNvml(fake_gpus("by-hand", 2)))
    page = Client()
    page.force_login(make_user("root5", staff=True))
    form = {"form": "server", "leaf": 1, "slot": 0, "node": "by-hand"}
    refused = page.post("/cluster/topology/", {**form, "gpu_type": "Not A Slug"})
    assert refused.status_code == 400 and "gpu_type" in refused.content.decode()
    bad_pool = page.post("/cluster/topology/", {**form, "pool": "a b"})
    assert bad_pool.status_code == 400
    assert not Server.objects.exists() and PendingServer.listed().count() == 1
    done = page.post("/cluster/topology/", {**form, "gpu_type": H100, "pool": "train"})
    assert done.status_code == 302
    server = Server.objects.get(node="by-hand")
    assert (server.gpu_type, server.labels, server.gpu_count) == (H100, {"pool": "train"}, 2)
    assert not PendingServer.objects.exists()  # placed by hand: no longer waiting
    entry = AuditEntry.objects.get(action="server.add")
    assert entry.after["gpu_type"] == H100 and entry.after["labels"] == {"pool": "train"}
    html = page.get("/cluster/topology/").content.decode()
    assert 'data-node="by-hand" data-type="h100-80g" data-pool="train"' in html


@pytest.mark.django_db(transaction=True)
def test_the_editor_sets_type_and_pool_but_not_a_new_type_under_a_running_job(
    make_user: Callable[..., Any], alice: Any, acme: Any
) -> None:
    nodes = demo_cluster({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})
    Server.objects.filter(node=nodes[1]).update(labels={"rack": "r12"})
    page = Client()
    page.force_login(make_user("root6", staff=True))

    def retype(node: str, **fields: str) -> Any:
        return page.post("/cluster/topology/", {"form": "retype", "node": node, **fields})

    assert retype(nodes[1], gpu_type=H100, pool="train").status_code == 302
    server = Server.objects.get(node=nodes[1])
    assert (server.gpu_type, server.labels) == (H100, {"rack": "r12", "pool": "train"})
    entry = AuditEntry.objects.get(action="server.retype")
    assert entry.before == {"gpu_type": "default", "labels": {"rack": "r12"}}
    assert retype("nobody", gpu_type=H100).status_code == 404
    retype(nodes[1], gpu_type="Not A Slug")
    assert Server.objects.get(node=nodes[1]).gpu_type == H100  # refused: unchanged

    acme.profile_jobs = False
    acme.save()
    job = _submit(alice, acme, gpus=2, max_gpus=2)
    run_tick(policy="fifo")
    held = Server.objects.filter(gpu_set__assignment__job=job).distinct().get()
    refused = page.post(
        "/cluster/topology/",
        {"form": "retype", "node": held.node, "gpu_type": A100},
        follow=True,
    )
    assert "a job never straddles types" in refused.content.decode()
    held.refresh_from_db()
    assert held.gpu_type != A100
    assert retype(held.node, gpu_type=held.gpu_type, pool="busy").status_code == 302
    assert Server.objects.get(node=held.node).labels["pool"] == "busy"  # labels may change
    assert AuditEntry.objects.filter(action="server.retype").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_api_sets_a_servers_type_and_labels(
    admin: APIClient, make_user: Callable[..., Any], alice: Any, acme: Any
) -> None:
    nodes = demo_cluster({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})
    path = f"/api/v1/servers/{nodes[0]}/type/"
    done = admin.post(path, {"gpu_type": H100, "labels": {"pool": "train"}}, format="json")
    assert done.status_code == 200, done.content
    assert (done.json()["gpu_type"], done.json()["pool"]) == (H100, "train")
    kept = admin.post(path, {"labels": {"pool": "infer"}}, format="json")
    assert kept.json()["gpu_type"] == H100  # no type given: kept
    bad = admin.post(path, {"gpu_type": "Not A Slug"}, format="json")
    assert bad.status_code == 400 and "gpu_type" in bad.json()["errors"]
    assert admin.post("/api/v1/servers/nobody/type/", {}, format="json").status_code == 404
    someone = APIClient()
    someone.force_authenticate(make_user("bob"))
    assert someone.post(path, {"gpu_type": A100}, format="json").status_code == 403
    assert Server.objects.get(node=nodes[0]).labels == {"pool": "infer"}

    acme.profile_jobs = False
    acme.save()
    job = _submit(alice, acme, gpus=2, max_gpus=2)
    run_tick(policy="fifo")
    held = Server.objects.filter(gpu_set__assignment__job=job).distinct().get()
    conflict = admin.post(f"/api/v1/servers/{held.node}/type/", {"gpu_type": A100}, format="json")
    assert conflict.status_code == 409
    assert "never straddles types" in str(conflict.json())
    assert Server.objects.get(node=held.node).gpu_type == held.gpu_type
