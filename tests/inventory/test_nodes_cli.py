"""``portalctl nodes`` against the real portal (Django's live server): type, pool, state,
health, pending servers; ``-o json`` is the API's rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from inventory.services import do_load_topology
from portalctl.cli import main
from tenancy.token_services import do_issue_token
from tests.inventory.test_registration import SPEC, beat
from tests.jobs.control_helpers import demo_cluster
from workers.tests.fake_nvml import FakeNvml, fake_gpus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(live_server: Any, make_user: Callable[..., Any], tmp_path: Any) -> dict[str, str]:
    token = do_issue_token(user=make_user("root", staff=True))
    return {
        "PORTAL_URL": live_server.url,
        "PORTAL_TOKEN": token,
        "XDG_CONFIG_HOME": str(tmp_path),
    }


def test_nodes_lists_type_pool_state_and_health(env: dict[str, str]) -> None:
    typed = {
        **SPEC,
        "servers": [
            {
                "leaf": 0,
                "slot": 0,
                "node": "a",
                "gpu_type": "a100-40g",
                "labels": {"pool": "train"},
            },
            {"leaf": 1, "slot": 0, "node": "b"},
        ],
    }
    do_load_topology(typed)
    beat("a", FakeNvml(fake_gpus("a", 2, temperature_c=71)))
    beat("b", None)
    beat("c", FakeNvml(fake_gpus("c", 2)))  # unknown: pending
    shown = CliRunner().invoke(main, ["nodes"], env=env)
    assert shown.exit_code == 0, shown.output
    line_a = next(line for line in shown.output.splitlines() if line.split()[:1] == ["a"])
    assert "a100-40g" in line_a and "train" in line_a and "up" in line_a
    assert "ok, max 71 C" in line_a
    line_b = next(line for line in shown.output.splitlines() if line.split()[:1] == ["b"])
    assert "not reported" in line_b
    as_json = CliRunner().invoke(main, ["nodes", "-o", "json"], env=env)
    rows = json.loads(as_json.output)
    assert [(r["node"], r["gpu_type"], r["pool"]) for r in rows] == [
        ("a", "a100-40g", "train"),
        ("b", "default", ""),
    ]
    pending = CliRunner().invoke(main, ["nodes", "--pending"], env=env)
    assert pending.exit_code == 0 and "NVIDIA A100-SXM4-40GB" in pending.output
    assert " c " in pending.output


def test_nodes_is_refused_to_a_non_admin(
    live_server: Any, make_user: Callable[..., Any], tmp_path: Any
) -> None:
    demo_cluster(SPEC)
    token = do_issue_token(user=make_user("bob"))
    env = {"PORTAL_URL": live_server.url, "PORTAL_TOKEN": token, "XDG_CONFIG_HOME": str(tmp_path)}
    refused = CliRunner().invoke(main, ["nodes"], env=env)
    assert refused.exit_code != 0 and "cluster admin" in refused.output
