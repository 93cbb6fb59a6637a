"""Typed servers: a topology document types its servers; bad values change nothing.

Through the service and through the topology editor's real request stack
(the import form answers a 400 whose error names the field).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from inventory.models import Gpu, Server
from inventory.server_types import MAX_LABELS, ServerTypeError, check_labels, pool_of
from inventory.services import InventoryError, do_load_topology, export_topology

pytestmark = pytest.mark.django_db

SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
A100 = {
    "gpu_type": "a100-40g",
    "gpu_model": "NVIDIA A100-SXM4-40GB",
    "gpu_memory_mib": 40960,
    "cpu_cores": 64,
    "memory_mib": 524288,
    "labels": {"pool": "train", "rack": "r12"},
}


def typed(**first: Any) -> dict[str, Any]:
    """SPEC with two servers, the first typed by ``first``."""
    return {
        **SPEC,
        "servers": [
            {"leaf": 0, "slot": 0, "node": "a", **first},
            {"leaf": 1, "slot": 0, "node": "b"},
        ],
    }


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


def test_a_typed_document_types_its_servers_and_exports_the_same() -> None:
    do_load_topology(typed(**A100))
    a, b = Server.objects.get(node="a"), Server.objects.get(node="b")
    assert (a.gpu_type, a.gpu_model, a.gpu_memory_mib, a.cpu_cores, a.memory_mib) == (
        "a100-40g",
        "NVIDIA A100-SXM4-40GB",
        40960,
        64,
        524288,
    )
    assert a.labels == {"pool": "train", "rack": "r12"} and pool_of(a.labels) == "train"
    assert (b.gpu_type, b.gpu_model, b.labels, b.gpu_count) == ("default", "", {}, 2)
    exported = export_topology()
    assert exported["servers"][0] == {"leaf": 0, "slot": 0, "node": "a", **A100}
    assert exported["servers"][1] == {"leaf": 1, "slot": 0, "node": "b"}
    assert do_load_topology(exported).unchanged


def test_retyping_a_kept_server_is_a_change() -> None:
    do_load_topology(typed(**A100))
    result = do_load_topology(typed(**{**A100, "labels": {"pool": "interactive"}}))
    assert not result.unchanged
    assert Server.objects.get(node="a").labels == {"pool": "interactive"}
    assert Gpu.objects.count() == 4  # same servers, same GPUs


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpu_type": "A100 40GB"}, "servers[0].gpu_type"),
        ({"gpu_type": ""}, "servers[0].gpu_type"),
        ({"gpu_model": "x" * 97}, "servers[0].gpu_model"),
        ({"gpu_memory_mib": -1}, "servers[0].gpu_memory_mib"),
        ({"gpu_memory_mib": True}, "servers[0].gpu_memory_mib"),
        ({"cpu_cores": "64"}, "servers[0].cpu_cores"),
        ({"memory_mib": 1.5}, "servers[0].memory_mib"),
        ({"labels": ["pool"]}, "servers[0].labels"),
        ({"labels": {"pool": "a b"}}, "servers[0].labels.pool"),
        ({"labels": {"pool": 3}}, "servers[0].labels.pool"),
        ({"labels": {"": "x"}}, "servers[0].labels"),
        ({"labels": {str(i): "x" for i in range(MAX_LABELS + 1)}}, "servers[0].labels"),
        ({"gpu_count": 3}, "servers[0].gpu_count"),
        ({"colour": "red"}, "servers[0]"),
    ],
)
def test_bad_typed_values_name_their_field_and_change_nothing(
    extra: dict[str, Any], field: str
) -> None:
    do_load_topology(typed(**A100))
    before = list(Server.objects.values())
    with pytest.raises(InventoryError) as refused:
        do_load_topology(typed(**extra))
    assert refused.value.field == field
    assert str(refused.value).startswith(field)
    assert list(Server.objects.values()) == before


def test_the_editor_imports_a_typed_document_and_refuses_a_bad_one_with_a_400(
    admin: Client,
) -> None:
    page = admin.post(
        "/cluster/topology/", {"form": "import", "document": json.dumps(typed(**A100))}
    )
    assert page.status_code == 302
    bad = typed(**{**A100, "labels": {"pool": "no spaces"}})
    page = admin.post("/cluster/topology/", {"form": "import", "document": json.dumps(bad)})
    assert page.status_code == 400
    assert "servers[0].labels.pool" in page.content.decode()
    assert Server.objects.get(node="a").labels == A100["labels"]


def test_label_rules() -> None:
    assert check_labels({"nvlink": "true", "topology.kubernetes.io/zone": "eu-1"}) == {
        "nvlink": "true",
        "topology.kubernetes.io/zone": "eu-1",
    }
    with pytest.raises(ServerTypeError):
        check_labels({"k": "v" * 64})
    assert pool_of(None) == "" and pool_of({"pool": 3}) == ""
