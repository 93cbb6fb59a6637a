"""FabricSpec validation, numbering, serialization and the networkx view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric.errors import TopologyError
from fabric.topology import FabricSpec, OcsSpec, load_spec, to_networkx


def small() -> FabricSpec:
    return FabricSpec(leaves=3, spines=2, servers_per_leaf=2, gpus_per_server=2)


def test_numbering_is_leaf_major() -> None:
    spec = small()
    assert spec.gpus_per_leaf == 4 and spec.total_gpus == 12 and spec.servers == 6
    gpu = 1 * 4 + 1 * 2 + 1  # leaf 1, server 1 in leaf, local 1
    assert (spec.leaf_of(gpu), spec.server_of(gpu), spec.port_of(gpu)) == (1, 3, 3)
    assert spec.gpu_at(1, 3) == gpu
    assert list(spec.gpus_of_server(3)) == [6, 7]
    assert [spec.spine_of_uplink(u) for u in range(4)] == [0, 1, 0, 1]
    assert spec.links_per_pair == 2


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"leaves": 0, "spines": 1, "servers_per_leaf": 1, "gpus_per_server": 1}, "leaves"),
        ({"leaves": 2, "spines": 3, "servers_per_leaf": 1, "gpus_per_server": 4}, "evenly"),
        (
            {"leaves": 2, "spines": 2, "servers_per_leaf": 1, "gpus_per_server": 2.5},
            "gpus_per_server",
        ),
        ({"leaves": 2, "spines": 2, "servers_per_leaf": 1}, "missing"),
        (
            {"leaves": 2, "spines": 2, "servers_per_leaf": 1, "gpus_per_server": 2, "x": 1},
            "unknown",
        ),
        (
            {
                "leaves": 2,
                "spines": 2,
                "servers_per_leaf": 1,
                "gpus_per_server": 2,
                "uplinks_per_leaf": 4,
            },
            "as many uplinks",
        ),
        (
            {
                "leaves": 2,
                "spines": 2,
                "servers_per_leaf": 1,
                "gpus_per_server": 2,
                "bandwidth": -1,
            },
            "link_gbps",
        ),
        (
            {
                "leaves": 4,
                "spines": 2,
                "servers_per_leaf": 1,
                "gpus_per_server": 2,
                "ocs": {"ports_per_spine": 1},
            },
            "OCS",
        ),
        ([1, 2], "object"),
    ],
)
def test_invalid_specs_say_why(data: object, fragment: str) -> None:
    with pytest.raises(TopologyError, match=fragment):
        FabricSpec.from_dict(data)  # type: ignore[arg-type]


def test_round_trip_and_files(tmp_path: Path) -> None:
    spec = FabricSpec(
        leaves=4, spines=2, servers_per_leaf=1, gpus_per_server=2, link_gbps=200.0, ocs=OcsSpec(2)
    )
    assert FabricSpec.from_dict(spec.to_dict()) == spec
    j = tmp_path / "t.json"
    j.write_text(
        json.dumps(
            {"leaves": 2, "spines": 2, "servers_per_leaf": 1, "gpus_per_server": 2, "bandwidth": 25}
        )
    )
    assert load_spec(j).link_gbps == 25
    y = tmp_path / "t.yaml"
    y.write_text("leaves: 2\nspines: 1\nservers_per_leaf: 2\ngpus_per_server: 1\n")
    assert load_spec(y).gpus_per_leaf == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(TopologyError, match="not valid"):
        load_spec(bad)
    with pytest.raises(TopologyError, match="cannot read"):
        load_spec(tmp_path / "missing.json")


def test_networkx_graph_has_every_cable() -> None:
    spec = small()
    g = to_networkx(spec)
    uplinks = [e for e in g.edges(data=True) if e[2]["kind"] == "uplink"]
    assert len(uplinks) == spec.leaves * spec.uplinks_per_leaf
    assert g.number_of_edges(("leaf", 0), ("spine", 1)) == 2
    nics = [e for e in g.edges(data=True) if e[2]["kind"] == "nic"]
    assert len(nics) == spec.total_gpus
    ocs = FabricSpec(leaves=2, spines=1, servers_per_leaf=1, gpus_per_server=2, ocs=OcsSpec(2))
    go = to_networkx(ocs)
    assert go.has_edge(("leaf", 1), ("ocs", 1)) and go.has_edge(("ocs", 1), ("spine", 0))


def test_fabric_imports_no_web_or_ml_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fabric, fabric.cli, fabric.contention, fabric.collisions;"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'django', 'celery', 'channels', 'torch'});"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={}
    )
    assert out.stdout.strip() == ""
