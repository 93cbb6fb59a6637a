"""Cluster inventory: loading a topology (idempotent, validated), servers, heartbeats."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from inventory.models import Fabric, Gpu, Server, ServerState
from inventory.services import (
    InventoryError,
    do_add_server,
    do_heartbeat,
    do_load_topology,
    do_mark_silent_servers_down,
    do_remove_server,
    do_set_server_state,
    export_topology,
)
from jobs.models import JobCable, JobGpu

pytestmark = pytest.mark.django_db
DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def test_load_creates_numbered_inventory_and_is_idempotent() -> None:
    result = do_load_topology(DEMO)
    assert result.created and result.servers_added == 4
    assert list(Server.objects.values_list("node", "leaf", "slot")) == [
        ("node-0", 0, 0),
        ("node-1", 0, 1),
        ("node-2", 1, 0),
        ("node-3", 1, 1),
    ]
    assert list(Gpu.objects.filter(server__node="node-3").values_list("index", flat=True)) == [6, 7]
    assert do_load_topology(DEMO).unchanged
    assert Gpu.objects.count() == 8


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"leaves": 0, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}, "leaves"),
        ({"leaves": 2, "spines": 3, "servers_per_leaf": 2, "gpus_per_server": 2}, "spines"),
        ({"leaves": 2, "spines": 2, "servers_per_leaf": 2}, "gpus_per_server"),
        ([1, 2], "JSON object"),
        ({**DEMO, "servers": [{"leaf": 5, "slot": 0, "node": "x"}]}, "leaf"),
        ({**DEMO, "servers": [{"leaf": 0, "slot": 0, "node": "bad name!"}]}, "node name"),
        (
            {
                **DEMO,
                "servers": [
                    {"leaf": 0, "slot": 0, "node": "a"},
                    {"leaf": 0, "slot": 0, "node": "b"},
                ],
            },
            "position",
        ),
    ],
)
def test_bad_topologies_change_nothing(doc: Any, message: str) -> None:
    do_load_topology(DEMO)
    with pytest.raises(InventoryError, match=message):
        do_load_topology(doc)
    assert Fabric.objects.get().leaves == 2 and Server.objects.count() == 4


def _hold(job: Any, gpu_indices: list[int]) -> None:
    for rank, index in enumerate(gpu_indices):
        JobGpu.objects.create(job=job, gpu=Gpu.objects.get(index=index), rank=rank)


@pytest.fixture
def running_job(alice: Any, acme: Any) -> Any:
    from jobs.services import check_job_spec, do_submit_job

    spec = check_job_spec(tenant=acme, data={"name": "j", "workload": "mlp-digits", "gpus": 2})
    return do_submit_job(user=alice, tenant=acme, spec=spec)


def test_changes_that_would_orphan_running_jobs_are_refused(running_job: Any) -> None:
    do_load_topology(DEMO)
    _hold(running_job, [2, 3])  # node-1
    with pytest.raises(InventoryError, match="orphan"):
        do_load_topology({**DEMO, "leaves": 4})
    with pytest.raises(InventoryError, match="node-1"):
        do_remove_server(node="node-1")
    servers = [{"leaf": 0, "slot": 0, "node": "node-0"}, {"leaf": 0, "slot": 1, "node": "node-1"}]
    with pytest.raises(InventoryError, match="node-1") as info:
        do_load_topology({**DEMO, "servers": [*servers[:1]]})
    assert "drain" in str(info.value)
    assert Server.objects.count() == 4
    result = do_load_topology({**DEMO, "servers": servers})  # drops idle node-2, node-3
    assert result.servers_removed == 2 and Server.objects.count() == 2


def test_db_constraints_forbid_double_allocation(running_job: Any, alice: Any, acme: Any) -> None:
    from jobs.services import check_job_spec, do_submit_job

    do_load_topology(DEMO)
    other = do_submit_job(
        user=alice,
        tenant=acme,
        spec=check_job_spec(tenant=acme, data={"name": "k", "workload": "mlp-digits", "gpus": 1}),
    )
    _hold(running_job, [0])
    with pytest.raises(IntegrityError), transaction.atomic():
        JobGpu.objects.create(job=other, gpu=Gpu.objects.get(index=0), rank=0)
    JobCable.objects.create(job=running_job, leaf=0, port=1, spine=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobCable.objects.create(job=other, leaf=0, port=1, spine=1)


def test_add_remove_drain_and_export() -> None:
    do_load_topology({**DEMO, "servers": [{"leaf": 0, "slot": 0, "node": "a"}]})
    do_add_server(leaf=1, slot=1, node="b")
    with pytest.raises(InventoryError, match="already has"):
        do_add_server(leaf=1, slot=1, node="c")
    with pytest.raises(InventoryError, match="already used"):
        do_add_server(leaf=1, slot=0, node="a")
    with pytest.raises(InventoryError, match="leaf"):
        do_add_server(leaf=9, slot=0, node="z")
    do_set_server_state(node="b", state=ServerState.DRAINING)
    with pytest.raises(InventoryError):
        do_set_server_state(node="b", state="melting")
    exported = export_topology()
    assert exported["servers"] == [
        {"leaf": 0, "slot": 0, "node": "a"},
        {"leaf": 1, "slot": 1, "node": "b"},
    ]
    assert Server.objects.get(node="b").state == "draining"
    do_remove_server(node="b")
    assert not Gpu.objects.filter(index__in=[6, 7]).exists()
    assert do_load_topology(exported).servers_added == 1  # export → import round trip


def test_heartbeats_and_silence() -> None:
    do_load_topology(DEMO)
    now = timezone.now()
    for node in ("node-0", "node-1"):
        assert do_heartbeat(node=node, info={"slots": 2}, at=now - timedelta(seconds=60))
    assert do_heartbeat(node="node-2", info={}, at=now)
    assert not do_heartbeat(node="ghost", info={})
    assert sorted(do_mark_silent_servers_down(now=now, after_seconds=20)) == ["node-0", "node-1"]
    assert Server.objects.get(node="node-0").state == "down"
    do_heartbeat(node="node-0", info={}, at=now)
    assert Server.objects.get(node="node-0").state == "up"  # came back by itself
    do_set_server_state(node="node-2", state=ServerState.DOWN)
    do_heartbeat(node="node-2", info={}, at=now)
    assert Server.objects.get(node="node-2").state == "down"  # an admin's mark stays


def test_loadtopology_command(tmp_path: Path) -> None:
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(DEMO))
    out = StringIO()
    call_command("loadtopology", str(spec), stdout=out)
    assert "created" in out.getvalue()
    call_command("loadtopology", str(spec), stdout=out)
    assert "unchanged" in out.getvalue()
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CommandError, match="not valid"):
        call_command("loadtopology", str(bad))
    with pytest.raises(CommandError, match="cannot read"):
        call_command("loadtopology", str(tmp_path / "missing.json"))
    yml = tmp_path / "t.yaml"
    yml.write_text("leaves: 1\nspines: 2\nservers_per_leaf: 1\ngpus_per_server: 4\n")
    call_command("loadtopology", str(yml), stdout=out)
    assert Gpu.objects.count() == 4
