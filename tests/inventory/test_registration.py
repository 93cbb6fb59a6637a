"""Servers that register themselves, through the real signed report path.

Each heartbeat is built by the agent's own probe (``workers.agent.hardware``)
over a fake NVML at the library boundary, sealed with the node's key as the
agent seals it, and handed to ``control.reports.handle_signed_report`` (what
the report task runs).  The tick's side is read with ``control.state``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from control.reports import handle_signed_report
from control.state import read_cluster
from inventory.models import Gpu, PendingServer, Server, ServerState
from inventory.registration import do_accept_server
from inventory.services import InventoryError, do_load_topology, suspect_gpus
from jobs import agent_trust
from tests.jobs.control_helpers import demo_cluster
from workers.agent.hardware import HardwareProbe
from workers.protocol import Heartbeat
from workers.signing import seal
from workers.tests.fake_nvml import FakeNvml, fake_gpus

pytestmark = pytest.mark.django_db

SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def beat(node: str, nvml: Any | None, *, signer: str | None = None) -> str:
    """One heartbeat of ``node`` with its hardware as the agent reads it, through the handler."""
    probe = HardwareProbe(nvml, cuda=False)
    report = Heartbeat(
        node=node,
        device="cpu",
        slots=2,
        free_slots=(0, 1),
        workers=(),
        hardware=probe.report(),
    )
    who = signer or node
    envelope = seal(report.to_dict(), node=who, key=agent_trust.key_of(who), now=time.time())
    return handle_signed_report(envelope)


def empty_fabric() -> None:
    """A fabric with every position free."""
    do_load_topology({**SPEC, "servers": []})


def schedulable_on(node: str) -> set[int]:
    cluster = read_cluster()
    assert cluster is not None
    mine = {index for index, home in cluster.homes.items() if home.node == node}
    return mine & set(cluster.schedulable)


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("root", staff=True))
    return client


def test_an_unknown_server_is_pending_and_never_scheduled_until_accepted(admin: APIClient) -> None:
    """A new node's report makes it pending (no GPU rows); accepted onto a leaf it is scheduled."""
    empty_fabric()
    nvml = FakeNvml(fake_gpus("new-1", 2))
    assert beat("new-1", nvml) == "unknown node"
    pending = PendingServer.objects.get(node="new-1")
    assert pending.hardware["source"] == "nvml"
    assert [g["model"] for g in pending.hardware["gpus"]] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert not Server.objects.filter(node="new-1").exists()
    assert not Gpu.objects.filter(server__node="new-1").exists()
    listed = admin.get("/api/v1/servers/pending/")
    assert listed.status_code == 200
    assert [row["node"] for row in listed.json()] == ["new-1"]

    answer = admin.post(
        f"/api/v1/servers/{pending.pk}/accept/",
        {"leaf": 1, "gpu_type": "a100-40g", "labels": {"pool": "train"}},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    server = Server.objects.get(node="new-1")
    assert (server.leaf, server.slot, server.gpu_type, server.labels) == (
        1,
        0,
        "a100-40g",
        {"pool": "train"},
    )
    assert server.gpu_model == "NVIDIA A100-SXM4-40GB" and server.gpu_memory_mib == 40960
    assert list(server.gpu_set.order_by("local").values_list("uuid", flat=True)) == [
        "GPU-new-1-0000",
        "GPU-new-1-0001",
    ]
    assert not PendingServer.objects.exists()
    assert AuditEntry.objects.filter(action="server.accept").count() == 1
    assert schedulable_on("new-1") == set()  # not beating yet
    assert beat("new-1", nvml) == "heartbeat"
    assert schedulable_on("new-1") == {4, 5}
    assert Server.objects.get(node="new-1").state == ServerState.UP


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"leaf": 7}, "leaf"),
        ({"leaf": "zero"}, "leaf"),
        ({}, "leaf"),
        ({"leaf": 0, "slot": 9}, "slot"),
        ({"leaf": 0, "gpu_type": "A100 40GB!"}, "gpu_type"),
        ({"leaf": 0, "labels": {"pool": "a b"}}, "labels.pool"),
        ({"leaf": 0, "labels": {str(i): "x" for i in range(17)}}, "labels"),
        ({"leaf": 0, "labels": ["pool"]}, "labels"),
    ],
)
def test_a_bad_accept_is_a_400_naming_the_field_and_changes_nothing(
    admin: APIClient, body: dict[str, Any], field: str
) -> None:
    empty_fabric()
    beat("new-2", FakeNvml(fake_gpus("new-2", 2)))
    pending = PendingServer.objects.get(node="new-2")
    answer = admin.post(f"/api/v1/servers/{pending.pk}/accept/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"], answer.json()
    assert PendingServer.objects.filter(node="new-2").exists()
    assert not Server.objects.exists()


def test_accepting_a_server_whose_count_does_not_fit_is_refused() -> None:
    empty_fabric()
    beat("big", FakeNvml(fake_gpus("big", 8)))
    with pytest.raises(InventoryError, match="reports 8 GPUs"):
        do_accept_server(pending=PendingServer.objects.get().pk, leaf=0)
    assert not Server.objects.exists()


def test_accept_is_for_admins_only_and_404_for_an_unknown_one(
    admin: APIClient, make_user: Callable[..., Any]
) -> None:
    empty_fabric()
    beat("new-3", FakeNvml(fake_gpus("new-3", 2)))
    pending = PendingServer.objects.get()
    someone = APIClient()
    someone.force_authenticate(make_user("bob"))
    assert someone.post(f"/api/v1/servers/{pending.pk}/accept/", {"leaf": 0}).status_code == 403
    assert admin.post("/api/v1/servers/9999/accept/", {"leaf": 0}).status_code == 404
    assert not Server.objects.exists()


def test_a_server_reporting_a_missing_gpu_is_drained_with_the_reason() -> None:
    nodes = demo_cluster(SPEC)
    node = nodes[0]
    nvml = FakeNvml(fake_gpus(node, 2))
    assert beat(node, nvml) == "heartbeat"  # the first report is learned: model, UUIDs
    server = Server.objects.get(node=node)
    assert server.state == ServerState.UP and server.gpu_model == "NVIDIA A100-SXM4-40GB"
    assert schedulable_on(node) == {0, 1}
    nvml.gpus.pop()  # GPU 1 falls off the bus
    assert beat(node, nvml) == "heartbeat"
    server.refresh_from_db()
    assert server.state == ServerState.DRAINING
    assert server.state_reason == (
        "hardware differs: 1 GPUs reported, 2 expected; GPU 1 (GPU-node-0-0001) gone"
    )
    assert schedulable_on(node) == set()


def test_a_different_model_drains_and_a_report_without_gpus_says_nothing() -> None:
    node = demo_cluster(SPEC)[1]
    assert beat(node, FakeNvml(fake_gpus(node, 2))) == "heartbeat"
    assert beat(node, None) == "heartbeat"  # no NVML, no CUDA: not "every GPU gone"
    assert Server.objects.get(node=node).state == ServerState.UP
    swapped = FakeNvml(fake_gpus(node, 2, name="NVIDIA H100 80GB HBM3"))
    beat(node, swapped)
    server = Server.objects.get(node=node)
    assert server.state == ServerState.DRAINING
    assert "model NVIDIA H100 80GB HBM3 reported, NVIDIA A100-SXM4-40GB expected" in (
        server.state_reason
    )


def test_a_forged_report_for_another_node_is_refused_and_changes_nothing() -> None:
    nodes = demo_cluster(SPEC)
    victim, attacker = nodes[0], nodes[1]
    assert beat(victim, FakeNvml(fake_gpus(victim, 2))) == "heartbeat"
    one_gone = FakeNvml(fake_gpus(victim, 1))
    assert beat(victim, one_gone, signer=attacker) == "refused: wrong node"
    assert beat("ghost", one_gone, signer=attacker) == "refused: wrong node"
    assert Server.objects.get(node=victim).state == ServerState.UP
    assert not PendingServer.objects.exists()


def test_an_overheating_gpu_is_taken_out_of_service_as_a_suspect_one() -> None:
    node = demo_cluster(SPEC)[0]
    nvml = FakeNvml(fake_gpus(node, 2))
    beat(node, nvml)
    assert suspect_gpus() == []
    nvml.gpus[1].temperature_c = 97
    beat(node, nvml)
    [mark] = suspect_gpus()
    assert (mark.index, mark.by) == (1, "gpu health")
    assert mark.reason == "unhealthy: temperature 97 C above 90 C"
    cluster = read_cluster()
    assert cluster is not None and cluster.suspect == frozenset({1})
    assert Server.objects.get(node=node).state == ServerState.UP  # the other GPU still serves


def test_an_uncorrectable_ecc_error_marks_its_gpu() -> None:
    node = demo_cluster(SPEC)[0]
    nvml = FakeNvml(fake_gpus(node, 2))
    nvml.gpus[0].ecc_uncorrected = 3
    beat(node, nvml)
    assert [(m.index, m.reason) for m in suspect_gpus()] == [
        (0, "unhealthy: 3 uncorrectable ECC errors (limit 0)")
    ]


def test_the_cluster_view_shows_health_or_not_reported(
    admin: APIClient, make_user: Callable[..., Any]
) -> None:
    nodes = demo_cluster(SPEC)
    beat(nodes[0], FakeNvml(fake_gpus(nodes[0], 2, temperature_c=61)))
    beat(nodes[1], None)
    rows = {row["node"]: row for row in admin.get("/api/v1/servers/").json()}
    assert rows[nodes[0]]["gpus"][0]["health"]["temperature_c"] == 61
    assert rows[nodes[1]]["gpus"][0]["health"] is None
    assert rows[nodes[1]]["health"] == "not reported"
    page = Client()
    page.force_login(make_user("root2", staff=True))
    html = page.get("/cluster/").content.decode()
    assert "not reported" in html and "61" in html


def test_the_topology_editor_lists_pending_servers_and_accepts_one(
    make_user: Callable[..., Any],
) -> None:
    empty_fabric()
    beat("new-4", FakeNvml(fake_gpus("new-4", 2)))
    pending = PendingServer.objects.get()
    page = Client()
    page.force_login(make_user("root3", staff=True))
    assert 'id="pending-new-4"' in page.get("/cluster/topology/").content.decode()
    assert 'id="pending-new-4"' in page.get("/cluster/").content.decode()
    refused = page.post(
        "/cluster/topology/",
        {"form": "accept", "pending": pending.pk, "leaf": 0, "gpu_type": "Not A Slug"},
    )
    assert refused.status_code == 400
    assert 'data-field="gpu_type"' in refused.content.decode()
    assert not Server.objects.exists()
    done = page.post(
        "/cluster/topology/",
        {"form": "accept", "pending": pending.pk, "leaf": 1, "slot": 1, "pool": "train"},
    )
    assert done.status_code == 302
    server = Server.objects.get(node="new-4")
    assert (server.leaf, server.slot, server.labels) == (1, 1, {"pool": "train"})
    html = page.get("/cluster/topology/").content.decode()
    assert "pending-new-4" not in html and 'class="server-pool">train<' in html


def test_prometheus_has_health_series_only_where_nvml_reported(settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-secret"
    nodes = demo_cluster(SPEC)
    beat(nodes[0], FakeNvml(fake_gpus(nodes[0], 2, temperature_c=66)))
    beat(nodes[1], None)
    scraper = Client(headers={"Authorization": "Bearer scrape-secret"})
    text = scraper.get("/metrics").content.decode()
    assert (
        f'portal_gpu_temperature_celsius{{gpu="1",gpu_type="default",node="{nodes[0]}"}} 66.0'
        in (text)
    )
    assert f'node="{nodes[1]}"' not in text  # no NVML there: no series at all
    assert 'portal_gpus_by_type{gpu_type="default",held="no"} 8.0' in text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpus", [{"model": "x", "memory_mib": 1}] * 65),
        ("gpus", [{"model": "x", "memory_mib": -1}]),
        ("gpus", [{"model": "x" * 500, "memory_mib": 1}]),
        ("cpu_cores", "many"),
        ("source", "trust-me"),
    ],
)
def test_a_hostile_hardware_report_is_refused_and_changes_nothing(key: str, value: Any) -> None:
    nodes = demo_cluster(SPEC)
    body = Heartbeat(
        node="intruder", device="cpu", slots=2, free_slots=(), workers=(), hardware=None
    ).to_dict()
    body["hardware"] = {"source": "nvml", "health": "nvml", "gpus": [], key: value}
    envelope = seal(body, node="intruder", key=agent_trust.key_of("intruder"), now=time.time())
    assert handle_signed_report(envelope).startswith("invalid")
    body["node"] = nodes[0]
    envelope = seal(body, node=nodes[0], key=agent_trust.key_of(nodes[0]), now=time.time())
    assert handle_signed_report(envelope).startswith("invalid")
    assert not PendingServer.objects.exists()
    assert Server.objects.get(node=nodes[0]).state == ServerState.UP


def test_the_topology_editor_shows_health_and_the_drain_reason(
    make_user: Callable[..., Any],
) -> None:
    nodes = demo_cluster(SPEC)
    nvml = FakeNvml(fake_gpus(nodes[0], 2))
    beat(nodes[0], nvml)
    beat(nodes[1], None)
    nvml.gpus.pop()
    beat(nodes[0], nvml)
    page = Client()
    page.force_login(make_user("root4", staff=True))
    html = page.get("/cluster/topology/").content.decode()
    assert '<td class="server-health">ok</td>' in html
    assert '<td class="server-health">not reported</td>' in html
    assert "hardware differs: 1 GPUs reported, 2 expected" in html
