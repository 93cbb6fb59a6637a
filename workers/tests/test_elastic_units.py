"""Unit tests of the elastic runtime's pure parts and its Redis-backed pieces (one process)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.elastic import checkpoint
from workers.elastic.cli import WorkerArgumentError, parse_options
from workers.elastic.control import JobControl, publish
from workers.elastic.sampler import ElasticSampler, shard
from workers.runtime_events import ProgressEvent

REPO = Path(__file__).resolve().parents[2]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 64),
    worlds=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    seed=st.integers(0, 5),
)
def test_each_sample_once_per_epoch_whatever_the_world_sizes(
    n: int, batch: int, worlds: list[int], seed: int
) -> None:
    sampler = ElasticSampler(n, batch, seed)
    seen: list[int] = []
    for step in range(sampler.steps_per_epoch):
        world = worlds[step % len(worlds)]
        parts = [sampler.local_indices(step, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(parts), sampler.global_indices(step))
        seen += np.concatenate(parts).tolist()
    assert sorted(seen) == list(range(n))


def test_epochs_are_reshuffled_and_deterministic() -> None:
    a, b = ElasticSampler(100, 10, 1), ElasticSampler(100, 10, 1)
    assert np.array_equal(a.global_indices(3), b.global_indices(3))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert a.epoch_of(10) == 1 and a.steps_per_epoch == 10


def test_shard_sizes_differ_by_at_most_one() -> None:
    sizes = [len(shard(np.arange(10), r, 4)) for r in range(4)]
    assert sizes == [3, 3, 2, 2]
    with pytest.raises(ValueError):
        ElasticSampler(10, 2).local_indices(0, 4, 4)


def test_per_job_directory_checkpoints_keep_the_two_newest(tmp_path: Path) -> None:
    """The helpers for scripts that keep each job's checkpoints under ``<root>/<job>/``."""
    for step in (10, 20, 30):
        checkpoint.save(str(tmp_path), "j", step, {"model": {"w": torch.full((2,), float(step))}})
    state = checkpoint.load_latest(str(tmp_path), "j")
    assert state is not None and state["step"] == 30 and state["model"]["w"][0] == 30
    assert sorted(p.name for p in (tmp_path / "j" / "checkpoints").iterdir()) == [
        "step-000000020.json",
        "step-000000020.pt",
        "step-000000030.json",
        "step-000000030.pt",
    ]
    assert checkpoint.load_latest(str(tmp_path), "other") is None


BASE = ["--job", "j1", "--worker", "w0", "--batch-size", "8", "--checkpoint-dir", "/tmp/x"]


def test_cli_accepts_the_agent_contract() -> None:
    opts = parse_options(
        [*BASE, "--workload", "mlp-digits", "--args", '{"epochs": 2}', "--recovery", "approximate",
         "--checkpoint-every", "5", "--checkpoint-minutes", "1.5", "--initial-world", "2",
         "--device", "cpu", "--redis-url", "redis://x", "--max-steps", "9"]
    )  # fmt: skip
    assert opts.args["epochs"] == 2 and opts.args["hidden"] == 128
    assert (opts.recovery, opts.initial_world, opts.max_steps) == ("approximate", 2, 9)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workload", "nope"], "unknown workload"),
        (["--workload", "mlp-digits", "--args", "{"], "not JSON"),
        (["--workload", "mlp-digits", "--args", '{"lr": -1}'], "lr"),
        (["--workload", "mlp-digits", "--initial-world", "0"], "initial-world"),
        (["--workload", "mlp-digits", "--device", "tpu"], "device"),
    ],
)
def test_cli_refuses_bad_input(extra: list[str], message: str) -> None:
    with pytest.raises(WorkerArgumentError, match=message):
        parse_options([*BASE, "--redis-url", "redis://x", *extra])


def test_worker_exits_2_on_bad_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "workers.elastic.worker", *BASE, "--workload", "nope",
         "--redis-url", "redis://x"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown workload 'nope' (known: mlp-digits, resnet18-synthetic)"
    ]


def test_control_api_round_trip(redis_url: str) -> None:
    ctl = JobControl(redis_url, f"u{uuid.uuid4().hex[:8]}")
    try:
        assert ctl.status().state == "starting"
        ctl.request_scale_in(["w1"], "why")
        ctl.request_migration(["w2"], "move")
        entries: Any = ctl.redis.xrange(ctl.keys.control)
        assert [e[1]["kind"] for e in entries] == ["scale_in", "migrate"]
        assert json.loads(entries[1][1]["payload"])["joiners"] == 1
        event = ProgressEvent(step=3, samples_per_s=1.0, loss=0.5, world=2, generation=0)
        publish(ctl.redis, ctl.keys, event)
        events = ctl.read_events()
        assert events[0][1] == {
            "step": 3,
            "samples_per_s": 1.0,
            "loss": 0.5,
            "world": 2,
            "generation": 0,
            "kind": "progress",
        }
        assert ctl.read_events(events[-1][0]) == []
        ctl.redis.hset(ctl.keys.meta, mapping={"generation": 2, "members": '["a","b"]',
                                               "state": "running", "curve": '{"2": 5.0}'})  # fmt: skip
        status = ctl.status()
        assert status.generation == 2 and status.members == ("a", "b")
        assert status.throughput_curve == {2: 5.0}
        with pytest.raises(ValueError):
            ctl.request_profile(3, 2)
    finally:
        ctl.cleanup()
    assert not list(ctl.redis.scan_iter(match=ctl.keys.prefix + "*"))


def test_redis_store_semantics(redis_url: str) -> None:
    """The store calls that gloo's rendezvous makes (the multi-process tests build real groups)."""
    import torch.distributed as dist

    from workers.elastic.store import RedisStore

    prefix = f"edl:u{uuid.uuid4().hex[:8]}:store:"
    store = RedisStore(redis_url, prefix, timeout=timedelta(seconds=1))
    try:
        store.set("a", b"1")
        assert store.get("a") == b"1" and store.check(["a"]) and not store.check(["a", "b"])
        assert store.add("n", 2) == 2 and store.add("n", 3) == 5
        assert store.compare_set("c", "", "x") == b"x"
        assert store.compare_set("c", "y", "z") == b"x"
        assert store.compare_set("c", "x", "z") == b"z"
        assert store.num_keys() == 3
        assert store.delete_key("a") and not store.check(["a"])
        threading.Timer(0.2, lambda: store.clone().set("late", b"v")).start()
        store.wait(["late"])
        with pytest.raises(dist.DistStoreError):
            store.wait(["never"], timedelta(seconds=0.2))
    finally:
        for key in store._client.scan_iter(match=prefix + "*"):
            store._client.delete(key)


def test_a_store_wait_gives_up_once_its_worker_is_abandoned(redis_url: str) -> None:
    """A newcomer's rendezvous ends when its job has ended, not after the whole timeout."""
    import torch.distributed as dist

    from workers.elastic.store import ABANDON_CHECK_S, RedisStore

    asked: list[float] = []

    def abandoned() -> str | None:
        asked.append(time.monotonic())
        return "the job ended" if len(asked) >= 2 else None

    prefix = f"edl:u{uuid.uuid4().hex[:8]}:store:"
    store = RedisStore(redis_url, prefix, timeout=timedelta(seconds=60), abandoned=abandoned)
    began = time.monotonic()
    with pytest.raises(dist.DistStoreError, match=r"gave up waiting for .*the job ended"):
        store.clone().wait(["never"])  # a clone asks the same callback
    assert len(asked) == 2 and time.monotonic() - began < 3 * ABANDON_CHECK_S + 1
    store.set("there", b"1")
    store.wait(["there"])  # a key already there: nothing asked
    assert len(asked) == 2
    store._client.delete(prefix + "there")
