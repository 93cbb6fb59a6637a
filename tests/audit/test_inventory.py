"""Topology and server changes leave one audit row each; a drain names who drained."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import AuditEntry
from inventory.models import Server
from inventory.services import do_load_topology, do_set_server_state
from tests.audit.helpers import count, only_row

pytestmark = pytest.mark.django_db

SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


@pytest.fixture
def root(make_user: Callable[..., Any]) -> Any:
    return make_user("root", staff=True)


@pytest.fixture
def admin(root: Any) -> Client:
    client = Client(REMOTE_ADDR="192.0.2.7")
    client.force_login(root)
    return client


def generate(client: Client, **overrides: Any) -> Any:
    body = {"form": "generate", **SPEC, "link_gbps": "100", **overrides}
    return client.post("/cluster/topology/", body)


def test_a_topology_load_records_counts_not_the_document(admin: Client, root: Any) -> None:
    assert generate(admin).status_code == 302
    row = only_row("topology.load")
    assert (row.actor_id, row.via, row.client_address) == (root.pk, "session", "192.0.2.7")
    assert row.tenant_id is None and row.object_type == "inventory.fabric"
    assert row.before == {"fabric": None, "servers": 0, "gpus": 0}
    assert row.after["servers"] == 4 and row.after["gpus"] == 8
    assert row.after["servers_added"] == 4 and row.after["servers_removed"] == 0
    assert row.after["fabric"]["leaves"] == 2

    assert generate(admin).status_code == 302  # the same topology: nothing changed
    assert count("topology.load") == 1
    generate(admin, leaves="9999")  # refused by the form: nothing changed
    assert count("topology.load") == 1


def test_the_command_acts_as_the_system(tmp_path: Path) -> None:
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(SPEC))
    call_command("loadtopology", str(spec), stdout=None)
    row = only_row("topology.load")
    assert (row.actor_id, row.actor_name, row.via) == (None, "system", "manage.py loadtopology")
    assert row.client_address is None


def test_drain_undrain_down_name_the_admin(admin: Client, root: Any) -> None:
    do_load_topology(SPEC)
    admin.post("/cluster/topology/servers/node-0/drain/")
    server = Server.objects.get(node="node-0")
    assert (server.state, server.state_reason) == ("draining", "drained by root")
    row = only_row("server.drain")
    assert (row.actor_name, row.via, row.object_id) == ("root", "session", str(server.pk))
    assert row.before == {"state": "up", "state_reason": ""}
    assert row.after == {"state": "draining", "state_reason": "drained by root"}

    admin.post("/cluster/topology/servers/node-0/drain/")  # already draining: no change
    assert count("server.drain") == 1
    admin.post("/cluster/topology/servers/node-0/undrain/")
    assert only_row("server.undrain").after["state_reason"] == "returned to service by root"
    admin.post("/cluster/topology/servers/node-0/down/")
    assert only_row("server.down").after == {"state": "down", "state_reason": "marked down by root"}


def test_a_reason_given_by_the_caller_is_kept(root: Any) -> None:
    do_load_topology(SPEC)
    do_set_server_state(node="node-1", state="down", reason="PSU replaced", user=root)
    assert Server.objects.get(node="node-1").state_reason == "PSU replaced"
    assert only_row("server.down").actor_name == "root"


def test_adding_and_removing_a_server(admin: Client) -> None:
    do_load_topology({**SPEC, "servers": [{"leaf": 0, "slot": 0, "node": "a"}]})
    before = AuditEntry.objects.count()
    page = admin.post(
        "/cluster/topology/", {"form": "server", "leaf": "1", "slot": "1", "node": "n9"}
    )
    assert page.status_code == 302
    added = only_row("server.add")
    assert added.actor_name == "root"
    assert added.after == {
        "node": "n9",
        "leaf": 1,
        "slot": 1,
        "state": "up",
        "state_reason": "",
        "gpus": 2,
    }
    admin.post("/cluster/topology/", {"form": "server", "leaf": "1", "slot": "1", "node": "n10"})
    assert count("server.add") == 1  # the place is taken: refused, nothing recorded
    admin.post("/cluster/topology/servers/n9/remove/")
    removed = only_row("server.remove")
    assert removed.before["node"] == "n9" and removed.before["gpus"] == 2 and removed.after == {}
    assert AuditEntry.objects.count() == before + 2
