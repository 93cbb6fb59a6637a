"""Checkpoints, artifacts and metrics of the elastic runtime, on a directory and on S3.

The checkpoint tests run against both stores (moto's S3 server on loopback for
``s3``); the event tests use the real Redis of the test settings.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from workers.artifacts import ArtifactCorrupt, ArtifactStore
from workers.clock import ManualClock
from workers.elastic import checkpoint
from workers.elastic.checkpoint import Checkpoints, Manifest, to_prune
from workers.elastic.cli import options_from_env, options_to_env, parse_options
from workers.elastic.control import JobControl
from workers.elastic.keys import JobKeys
from workers.elastic.outputs import ProgramOutputs, check_artifact_name
from workers.runtime_events import (
    ArtifactSavedEvent,
    CheckpointSavedEvent,
    CheckpointSkippedEvent,
    MetricPoint,
    MetricsEvent,
)
from workers.schema import ProtocolError

torch.set_num_threads(1)
SHA = "ab" * 32


@pytest.fixture
def store(root_url: str) -> ArtifactStore:
    """An empty job store: a directory, or a fresh prefix of the S3 bucket."""
    return ArtifactStore(f"{root_url}/tenants/acme/jobs/7")


def model_state(step: int) -> dict[str, Any]:
    """A snapshot like ``TrainingState.snapshot()``: tensors and plain data."""
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(step))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "plan_seen": 3,
        "actions": {"7": [{"kind": "stop", "base_generation": 0, "k": 2, "reason": None}]},
    }


def flip_a_byte(store: ArtifactStore, rel: str) -> None:
    with store.open_read(rel) as stream:
        data = bytearray(stream.read())
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(rel, bytes(data))


# --- checkpoints ------------------------------------------------------------------------


def test_save_load_and_keep_rule(store: ArtifactStore) -> None:
    clock = ManualClock()
    checkpoints = Checkpoints(store, keep=2, clock=clock)
    states = {step: model_state(step) for step in (10, 20, 30)}
    saved = [checkpoints.save(step, state) for step, state in states.items()]
    assert saved[0].stored.path == "checkpoints/step-000000010.pt" and saved[0].pruned == ()
    assert saved[2].pruned == ("checkpoints/step-000000010.pt",)
    assert store.list("checkpoints") == [
        "checkpoints/step-000000020.json",
        "checkpoints/step-000000020.pt",
        "checkpoints/step-000000030.json",
        "checkpoints/step-000000030.pt",
    ]
    with store.open_read("checkpoints/step-000000030.json") as stream:
        manifest = json.loads(stream.read())
    assert manifest == {
        "step": 30,
        "file": "step-000000030.pt",
        "size": saved[2].stored.size,
        "sha256": saved[2].stored.sha256,
        "final": False,
        "saved_at": clock.now(),
    }
    restored, skipped = checkpoints.load_latest()
    assert restored is not None and restored.step == 30 and skipped == []
    assert torch.equal(restored.state["model"]["weight"], states[30]["model"]["weight"])
    assert restored.state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert restored.state["actions"] == model_state(30)["actions"]
    assert checkpoints.load_step(20)["step"] == 20


def test_the_final_checkpoint_is_kept_besides_the_newest_ones(store: ArtifactStore) -> None:
    checkpoints = Checkpoints(store, keep=1)
    checkpoints.save(10, model_state(10))
    final = checkpoints.save(15, model_state(15), final=True)
    assert final.final and final.pruned == ()  # 10 is still the newest regular one
    latest, _ = checkpoints.latest()
    assert latest is not None and latest.step == 15 and latest.final
    assert checkpoints.save(20, model_state(20)).pruned == ("checkpoints/step-000000010.pt",)
    # a job that goes on after a final one (resumed and run longer) keeps the newest final
    assert checkpoints.save(30, model_state(30), final=True).pruned == (
        "checkpoints/step-000000015.pt",
    )
    assert checkpoints.save(40, model_state(40)).pruned == ("checkpoints/step-000000020.pt",)
    assert [(m.step, m.final) for m in checkpoints.manifests()[0]] == [(40, False), (30, True)]


def test_a_checkpoint_without_manifest_is_ignored_then_pruned(store: ArtifactStore) -> None:
    checkpoints = Checkpoints(store, keep=2)
    checkpoints.save(10, model_state(10))
    checkpoints.save(20, model_state(20))
    store.delete("checkpoints/step-000000020.json")  # as if the save died before its manifest
    restored, skipped = checkpoints.load_latest()
    assert restored is not None and restored.step == 10 and skipped == []
    saved = checkpoints.save(30, model_state(30))
    assert saved.pruned == ("checkpoints/step-000000020.pt",)
    assert [m.step for m in checkpoints.manifests()[0]] == [30, 10]


def test_a_corrupt_checkpoint_is_skipped_for_the_previous_one(store: ArtifactStore) -> None:
    checkpoints = Checkpoints(store, keep=2)
    checkpoints.save(10, model_state(10))
    checkpoints.save(20, model_state(20))
    flip_a_byte(store, "checkpoints/step-000000020.pt")
    restored, skipped = checkpoints.load_latest()
    assert restored is not None and restored.step == 10
    assert [s.step for s in skipped] == [20] and "sha256" in skipped[0].reason
    latest, skipped = checkpoints.latest()  # what consistent recovery goes back to
    assert latest is not None and latest.step == 10 and [s.step for s in skipped] == [20]
    with pytest.raises(ArtifactCorrupt):
        checkpoints.load_step(20)
    # the job went back to 10; its next checkpoint replaces the abandoned timeline
    assert checkpoints.save(15, model_state(15)).pruned == ("checkpoints/step-000000020.pt",)


def test_a_checkpoint_that_would_run_code_is_not_loaded(store: ArtifactStore) -> None:
    """Tenant programs write the store: a pickle with a callable is refused, not run."""
    checkpoints = Checkpoints(store)
    checkpoints.save(10, model_state(10))
    buffer = io.BytesIO()
    torch.save({"step": 20, "model": {}, "hook": os.system}, buffer)
    stored = store.put_bytes("checkpoints/step-000000020.pt", buffer.getvalue())
    manifest = Manifest(20, "step-000000020.pt", stored.size, stored.sha256, False, 0.0)
    store.put_bytes("checkpoints/step-000000020.json", manifest.to_json())
    restored, skipped = checkpoints.load_latest()
    assert restored is not None and restored.step == 10
    assert [s.step for s in skipped] == [20]


def test_a_broken_manifest_is_reported() -> None:
    with pytest.raises(ValueError, match="names"):
        Manifest.from_json(
            json.dumps(
                {
                    "step": 5,
                    "file": "../x.pt",
                    "size": 1,
                    "sha256": SHA,
                    "final": False,
                    "saved_at": 0,
                }
            ).encode()
        )
    with pytest.raises(ValueError, match="size"):
        Manifest.from_json(b'{"step": 5, "file": "step-000000005.pt", "size": "1"}')


def m(step: int, final: bool = False) -> Manifest:
    return Manifest(step, f"step-{step:09d}.pt", 1, SHA, final, 0.0)


@pytest.mark.parametrize(
    ("manifests", "keep", "saved", "pruned"),
    [
        ([m(10), m(20), m(30)], 2, 30, {10}),
        ([m(10), m(20), m(30)], 3, 30, set()),
        ([m(10), m(20, final=True), m(30), m(40)], 1, 40, {10, 30}),
        ([m(10, final=True), m(20, final=True), m(30)], 2, 30, {10}),
        ([m(10), m(15), m(20), m(30)], 2, 15, {20, 30}),  # went back to 10: 20, 30 abandoned
    ],
)
def test_keep_rule(manifests: list[Manifest], keep: int, saved: int, pruned: set[int]) -> None:
    assert to_prune(manifests, keep, saved) == pruned


def test_per_job_helpers_for_scripts(tmp_path: Path) -> None:
    checkpoint.save(str(tmp_path), "bench", 3, model_state(3))
    state = checkpoint.load_latest(str(tmp_path), "bench")
    assert state is not None and state["step"] == 3


# --- options ----------------------------------------------------------------------------

BASE = ["--job", "j1", "--worker", "w0", "--batch-size", "8", "--workload", "mlp-digits"]


def test_store_url_its_alias_and_the_keep_count() -> None:
    opts = parse_options(
        [*BASE, "--store-url", "s3://b/tenants/a/jobs/3", "--redis-url", "redis://x"]
    )
    assert opts.store_url == "s3://b/tenants/a/jobs/3" and opts.checkpoint_keep == 2
    alias = parse_options(
        [*BASE, "--checkpoint-dir", "/ck", "--checkpoint-keep", "5", "--redis-url", "r"]
    )
    assert alias.store_url == "/ck" and alias.checkpoint_keep == 5
    assert options_from_env({"EDL_OPTIONS": options_to_env(alias)}) == alias
    legacy = {k: v for k, v in dataclasses.asdict(alias).items() if k != "store_url"}
    legacy["checkpoint_dir"] = "/old"  # an agent from before the rename
    assert options_from_env({"EDL_OPTIONS": json.dumps(legacy)}).store_url == "/old"


# --- events -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: CheckpointSavedEvent(step=1, path="artifacts/x.pt", size=1, sha256=SHA), "path"),
        (lambda: CheckpointSavedEvent(step=1, path="checkpoints/../x", size=1, sha256=SHA), "path"),
        (
            lambda: CheckpointSavedEvent(step=-1, path="checkpoints/a.pt", size=1, sha256=SHA),
            "step",
        ),
        (
            lambda: CheckpointSavedEvent(step=1, path="checkpoints/a.pt", size=-1, sha256=SHA),
            "size",
        ),
        (
            lambda: CheckpointSavedEvent(step=1, path="checkpoints/a.pt", size=1, sha256="x"),
            "sha256",
        ),
        (
            lambda: CheckpointSavedEvent(
                step=1, path="checkpoints/a.pt", size=1, sha256=SHA, pruned=("logs/x",)
            ),
            "pruned[0]",
        ),
        (lambda: CheckpointSkippedEvent(step="1", reason="x"), "step"),  # type: ignore[arg-type]
        (lambda: ArtifactSavedEvent(name="a", path="artifacts/b", size=1, sha256=SHA), "path"),
        (
            lambda: ArtifactSavedEvent(name="a", path="artifacts/a", size=1, sha256=SHA, step=-2),
            "step",
        ),
        (lambda: MetricPoint(step=1, values={}), "values"),
        (lambda: MetricPoint(step=1, values={"1abc": 1.0}), "values"),
        (lambda: MetricPoint(step=1, values={"loss": float("nan")}), "loss"),
        (lambda: MetricPoint(step=1, values={"loss": True}), "loss"),
        (lambda: MetricPoint(step=1, values={f"m{i}": 1.0 for i in range(33)}), "values"),
        (lambda: MetricsEvent(points=()), "points"),
    ],
)
def test_events_refuse_bad_fields(build: Any, field: str) -> None:
    with pytest.raises(ProtocolError, match=field.replace("[", r"\[").replace("]", r"\]")):
        build()


def test_events_have_the_shared_wire_names() -> None:
    point = MetricPoint(step=3, values={"val/loss": 1, "acc": 0.5})
    assert point.values == {"val/loss": 1.0, "acc": 0.5}
    assert MetricsEvent(points=(point,)).to_dict() == {
        "kind": "metrics",
        "points": [{"step": 3, "values": {"val/loss": 1.0, "acc": 0.5}}],
    }
    saved = CheckpointSavedEvent(step=5, path="checkpoints/step-000000005.pt", size=9, sha256=SHA)
    assert saved.to_dict()["kind"] == "checkpoint_saved" and saved.to_dict()["pruned"] == []


# --- what a program hands the job -------------------------------------------------------


@pytest.fixture
def outputs(
    redis_server: str, tmp_path: Path
) -> Iterator[tuple[ProgramOutputs, JobControl, ManualClock]]:
    job = f"o{uuid.uuid4().hex[:8]}"
    clock = ManualClock()
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    control = JobControl(redis_server, job)
    yield (
        ProgramOutputs(ArtifactStore(str(tmp_path / "job")), client, JobKeys(job), clock),
        control,
        clock,
    )
    control.cleanup()


def kinds(control: JobControl, kind: str) -> list[dict[str, Any]]:
    return [e for _id, e in control.read_events() if e["kind"] == kind]


def test_save_artifact_uploads_and_announces(
    outputs: tuple[ProgramOutputs, JobControl, ManualClock], tmp_path: Path
) -> None:
    program, control, _clock = outputs
    local = tmp_path / "weights.bin"
    local.write_bytes(b"\x00" * 1000)
    stored = program.save_artifact(local, None, 12)
    renamed = program.save_artifact(str(local), "eval/final weights.bin", None)
    assert stored.path == "artifacts/weights.bin" and stored.size == 1000
    assert program.store.read_verified(renamed.path, 1000, stored.sha256) == b"\x00" * 1000
    assert kinds(control, "artifact_saved") == [
        {"kind": "artifact_saved", "name": "weights.bin", "path": "artifacts/weights.bin",
         "size": 1000, "sha256": stored.sha256, "step": 12},
        {"kind": "artifact_saved", "name": "eval/final weights.bin",
         "path": "artifacts/eval/final weights.bin", "size": 1000, "sha256": stored.sha256,
         "step": None},
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError):
        program.save_artifact(tmp_path / "missing", None, None)


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a//b", "a/./b", ".hidden", "a/.b", "a\\b", ""])
def test_artifact_names_stay_inside_artifacts(name: str) -> None:
    with pytest.raises(ValueError, match="artifact name"):
        check_artifact_name(name)


def test_metrics_go_out_at_most_once_a_second_and_on_flush(
    outputs: tuple[ProgramOutputs, JobControl, ManualClock],
) -> None:
    program, control, clock = outputs
    program.log_metrics(0, {"loss": 2.0})  # the first point goes out at once
    for step in range(1, 5):
        clock.advance(0.3)
        program.log_metrics(step, {"loss": 2.0 - step / 10, "acc": step / 10})
    program.log_metrics(5, {"loss": 9.0}, publish_it=False)  # another rank's call: checked only
    with pytest.raises(ProtocolError):
        program.log_metrics(6, {"loss": float("inf")})
    program.flush()
    program.flush()  # nothing left: no empty event
    events = kinds(control, "metrics")
    assert [[p["step"] for p in e["points"]] for e in events] == [[0], [1, 2, 3, 4]]
    assert events[1]["points"][3] == {"step": 4, "values": {"loss": 1.6, "acc": 0.4}}
