"""The agent obeys only commands signed for its node, and keeps jobs inside its storage roots.

In-process against the real Redis (as ``test_agent_core``): commands go
through ``Agent.receive_signed``, the entry point of the agent's Celery task.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers.agent import service
from workers.agent.agent import Agent
from workers.agent.config import AgentConfig, AgentConfigError
from workers.agent.store import AgentStore
from workers.clock import ManualClock
from workers.protocol import Command, Rejected, Stopped
from workers.signing import key_to_text, node_key, seal
from workers.tests.test_agent_core import Collected, start_payload

MASTER = b"trust-tests-master"


@pytest.fixture
def node() -> Iterator[str]:
    name = f"trust-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(str(settings.REDIS_URL), decode_responses=True)
    for key in cleanup.scan_iter(match=f"agent:{name}:*"):
        cleanup.delete(key)


def make_agent(node: str, tmp_path: Path, **config: Any) -> tuple[Agent, Collected, ManualClock]:
    url = str(settings.REDIS_URL)
    conf = AgentConfig(
        node=node,
        device="cpu",
        slots=2,
        redis_url=url,
        data_dir=tmp_path / "data",
        artifact_url=f"file://{tmp_path / 'store'}",
        key=node_key(MASTER, node),
        **config,
    )
    sent = Collected()
    clock = ManualClock(start=1_800_000_000.0)
    return Agent(conf, AgentStore.from_url(url, node), send=sent, clock=clock), sent, clock


def signed(node: str, payload: dict[str, Any], now: float, key: bytes | None = None) -> Any:
    return seal(payload, node=node, key=key or node_key(MASTER, node), now=now)


def stop(job: str, command_id: str) -> dict[str, Any]:
    return {"type": "stop_job", "job": job, "command_id": command_id, "grace_seconds": 0}


def test_forged_commands_are_refused_silently_and_start_nothing(node: str, tmp_path: Path) -> None:
    agent, sent, clock = make_agent(node, tmp_path)
    now = clock.now()
    start = start_payload("job-f", "c-forged", [0])
    other = f"{node}-other"
    forged = {
        "unsigned": start,
        "wrong key": signed(node, start, now, key=node_key(b"guess", node)),
        "other node": signed(other, start, now),
        "stale": signed(node, start, now - 3600),
        "future": signed(node, start, now + 3600),
        "tampered": {**signed(node, start, now), "body": {**start, "job": "job-g"}},
    }
    for envelope in forged.values():
        assert agent.receive_signed(envelope) == "refused"
    assert agent.running() == [] and sent.reports == []
    assert not agent.store.was_applied("c-forged")
    assert not (tmp_path / "data" / "jobs").exists()


def test_a_signed_command_is_applied_once(node: str, tmp_path: Path) -> None:
    agent, sent, clock = make_agent(node, tmp_path)
    envelope = signed(node, stop("job-s", "stop-1"), clock.now())
    assert agent.receive_signed(envelope) == "applied"
    assert agent.receive_signed(envelope) == "replayed"  # a redelivery inside the window
    agent.tick()
    assert [r.command_id for r in sent.of(Stopped)] == ["stop-1"]


def test_the_window_covers_a_redelivery_after_an_agent_restart(node: str, tmp_path: Path) -> None:
    agent, _, clock = make_agent(node, tmp_path, message_max_age_s=600.0)
    envelope = signed(node, stop("job-r", "stop-r"), clock.now())
    clock.advance(599)  # the agent was down; Celery redelivers the unacknowledged command
    assert agent.receive_signed(envelope) == "applied"
    late = signed(node, stop("job-r", "stop-late"), clock.now())
    clock.advance(601)
    assert agent.receive_signed(late) == "refused"


@pytest.mark.parametrize(
    "location",
    ["/etc", "/tmp", "{data}/../elsewhere", "{data}", "s3://someone-else/bucket", "relative/dir"],
)
def test_a_checkpoint_dir_outside_the_storage_roots_is_rejected(
    node: str, tmp_path: Path, location: str
) -> None:
    agent, sent, clock = make_agent(node, tmp_path)
    where = location.format(data=tmp_path / "data")
    payload = start_payload("job-c", "c-ckpt", [0], checkpoint_dir=where)
    assert agent.receive_signed(signed(node, payload, clock.now())) == "rejected"
    [rejected] = sent.of(Rejected)
    assert "storage roots" in rejected.error or "not an absolute directory" in rejected.error
    assert agent.running() == []


def test_a_symlink_out_of_the_storage_root_is_rejected(node: str, tmp_path: Path) -> None:
    agent, sent, clock = make_agent(node, tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "escape").symlink_to(tmp_path / "outside")
    payload = start_payload(
        "job-l", "c-link", [0], checkpoint_dir=str(tmp_path / "data" / "escape" / "ck")
    )
    assert agent.receive_signed(signed(node, payload, clock.now())) == "rejected"
    assert "outside the agent's storage roots" in sent.of(Rejected)[0].error


def test_locations_inside_the_roots_are_accepted(tmp_path: Path) -> None:
    config = AgentConfig(
        node="n",
        device="cpu",
        slots=1,
        redis_url="redis://unused",
        data_dir=tmp_path / "data",
        artifact_url=f"file://{tmp_path / 'store'}",
    )
    assert config.location_refusal(str(tmp_path / "data" / "checkpoints" / "job-1")) is None
    assert config.location_refusal(f"file://{tmp_path / 'store' / 'tenants'}") is None
    s3 = AgentConfig(**{**config.__dict__, "artifact_url": "s3://bucket/portal"})
    assert s3.location_refusal("s3://bucket/portal/tenants/a/jobs/1") is None
    assert s3.location_refusal("s3://bucket/portal-other/x") is not None
    assert s3.location_refusal("s3://bucket/portal/../x") is not None
    assert Command.from_dict(start_payload("j", "c", [0], checkpoint_dir="/etc"))  # wire-valid


def _options(node: str, **extra: Any) -> argparse.Namespace:
    parser = service.build_parser()
    return parser.parse_args(["--node", node, "--cpu", "--gpus", "1", *extra.get("argv", [])])


def test_the_agent_does_not_start_without_its_key(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://127.0.0.1:1/0", "PORTAL_DATA_DIR": str(tmp_path)}
    with pytest.raises(AgentConfigError, match="no agent key"):
        service.config_from_options(_options("n1"), environ=env)
    key = node_key(MASTER, "n1")
    with_env = service.config_from_options(
        _options("n1"), environ={**env, "AGENT_KEY": key_to_text(key)}
    )
    assert with_env.key == key
    path = tmp_path / "key"
    path.write_text(key_to_text(key) + "\n")
    from_flag = service.config_from_options(
        _options("n1", argv=["--key-file", str(path)]), environ=env
    )
    assert from_flag.key == key
    from_file = service.config_from_options(
        _options("n1"), environ={**env, "AGENT_KEY_FILE": str(path)}
    )
    assert from_file.key == key
    with pytest.raises(AgentConfigError, match="hex"):
        service.config_from_options(_options("n1"), environ={**env, "AGENT_KEY": "nope"})


def test_a_command_lost_with_its_agent_comes_back_while_still_fresh() -> None:
    """A SIGKILLed agent's unacknowledged command returns within the signing window, once."""
    from workers.agent.celery_app import make_app
    from workers.signing import DEFAULT_MAX_AGE_S

    conf = make_app("redis://127.0.0.1:1/0", environ={}).conf
    visibility = conf.broker_transport_options["visibility_timeout"]
    assert 0 < visibility < DEFAULT_MAX_AGE_S, visibility
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    shorter = {
        "AGENT_MESSAGE_MAX_AGE_SECONDS": "30",
        "AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS": "20",
    }
    opts = make_app("redis://127.0.0.1:1/0", environ=shorter).conf.broker_transport_options
    assert opts["visibility_timeout"] == 20
    with pytest.raises(ValueError, match="below the signing window"):
        make_app("redis://127.0.0.1:1/0", environ={"AGENT_MESSAGE_MAX_AGE_SECONDS": "30"})
