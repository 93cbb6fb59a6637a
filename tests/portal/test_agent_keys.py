"""Operators and the stack hand each agent the key the control plane checks its reports with."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from jobs.agent_trust import key_of, key_text
from portal.management.commands.runstack import stack_processes
from tests.jobs.control_helpers import demo_cluster
from workers.signing import key_from_text, master_secret, node_key


def agentkey(node: str) -> str:
    out = io.StringIO()
    call_command("agentkey", node, stdout=out)
    return out.getvalue().strip()


def test_agentkey_prints_the_nodes_own_key() -> None:
    printed = agentkey("node-0")
    assert key_from_text(printed) == key_of("node-0")
    assert printed != agentkey("node-1")
    with pytest.raises(CommandError):
        agentkey("bad node")


def test_the_master_secret_is_the_setting_else_derived_from_secret_key() -> None:
    with override_settings(AGENT_SIGNING_KEY="rotated", SECRET_KEY="s1"):
        assert key_of("node-0") == node_key(b"rotated", "node-0")
    with override_settings(AGENT_SIGNING_KEY="", SECRET_KEY="s1"):
        derived = key_of("node-0")
        assert derived == node_key(master_secret("", "s1"), "node-0")
    with override_settings(AGENT_SIGNING_KEY="", SECRET_KEY="s2"):
        assert key_of("node-0") != derived


@pytest.mark.django_db
def test_runstack_gives_every_agent_its_key() -> None:
    nodes = demo_cluster()
    specs = {s.name: s for s in stack_processes(host="127.0.0.1", port=1)}
    for node in nodes:
        assert specs[f"agent {node}"].env["AGENT_KEY"] == key_text(node)
