"""The wire format of the runtime's events, pinned: what goes into Redis and what reaches the portal.

Running runtimes, agents and portals of different versions interoperate only
while both formats stay put: the entry a runtime appends to ``edl:<job>:events``
(``kind`` and the exact JSON ``data``), and the report an agent makes of it
(the payload the portal verifies).  Each kind has a golden entry and a golden
report here, written from the code before the events were declared in one
place; a change to either is a change of protocol, never a refactor.

The agent reads the stream as untrusted input, and what it makes of entries
the runtime never writes (missing or mistyped fields, extra ones, too many
metric points) is pinned too: the same entries are accepted, the same reports
made, the same reasons given for a refusal.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from workers.agent.reports import report_from_event
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.job_events import decode_entry
from workers.runtime_events import (
    EVENT_KINDS,
    ArtifactSavedEvent,
    CheckpointSavedEvent,
    CheckpointSkippedEvent,
    FailedEvent,
    FinishedEvent,
    MetricPoint,
    MetricsEvent,
    ProfileDoneEvent,
    ProgressEvent,
    RecoveredEvent,
    RuntimeEvent,
    ScaleDoneEvent,
    StragglerEvent,
    WorkerFailedEvent,
)
from workers.schema import ProtocolError

SHA = "ab" * 32
COMMON = {"node": "n1", "job": "j1", "event_id": "7-0"}


def report(type_: str, **fields: Any) -> dict[str, Any]:
    """A golden report: its type, the agent's common fields, then its own."""
    return {"type": type_, **COMMON, **fields}


GOLDEN: list[tuple[RuntimeEvent, dict[str, str], dict[str, Any]]] = [
    (
        ProgressEvent(step=12, samples_per_s=256.5, loss=0.75, world=2, generation=1),
        {
            "kind": "progress",
            "data": '{"step": 12, "samples_per_s": 256.5, "loss": 0.75, "world": 2, '
            '"generation": 1}',
        },
        report("progress", step=12, samples_per_s=256.5, world=2, loss=0.75, generation=1),
    ),
    (
        ProgressEvent(step=0, samples_per_s=0.0, loss=None, world=1, generation=0),
        {
            "kind": "progress",
            "data": '{"step": 0, "samples_per_s": 0.0, "loss": null, "world": 1, "generation": 0}',
        },
        report("progress", step=0, samples_per_s=0.0, world=1, loss=None, generation=0),
    ),
    (
        ScaleDoneEvent(
            generation=3,
            world=3,
            members=("w0", "w1", "w2"),
            joiners=("w2",),
            leavers=(),
            pause_s=0.125,
            step=40,
        ),
        {
            "kind": "scale_done",
            "data": '{"generation": 3, "world": 3, "members": ["w0", "w1", "w2"], '
            '"joiners": ["w2"], "leavers": [], "pause_s": 0.125, "step": 40, "new_leader": null}',
        },
        report(
            "scale_done",
            world=3,
            step=40,
            generation=3,
            workers=["w0", "w1", "w2"],
            joiners=["w2"],
            leavers=[],
            pause_s=0.125,
            new_leader=None,
        ),
    ),
    (
        ScaleDoneEvent(
            generation=4,
            world=1,
            members=("w1",),
            joiners=(),
            leavers=("w0", "w2"),
            pause_s=0.5,
            step=41,
            new_leader="w1",
        ),
        {
            "kind": "scale_done",
            "data": '{"generation": 4, "world": 1, "members": ["w1"], "joiners": [], '
            '"leavers": ["w0", "w2"], "pause_s": 0.5, "step": 41, "new_leader": "w1"}',
        },
        report(
            "scale_done",
            world=1,
            step=41,
            generation=4,
            workers=["w1"],
            joiners=[],
            leavers=["w0", "w2"],
            pause_s=0.5,
            new_leader="w1",
        ),
    ),
    (
        StragglerEvent(worker="w1", ratio=1.5, step=7),
        {"kind": "straggler", "data": '{"worker": "w1", "ratio": 1.5, "step": 7}'},
        report("straggler", worker_id="w1", ratio=1.5),
    ),
    (
        WorkerFailedEvent(worker="w2", generation=3),
        {"kind": "worker_failed", "data": '{"worker": "w2", "generation": 3}'},
        report("worker_failed", worker_id="w2", error="", generation=3),
    ),
    (
        RecoveredEvent(
            mode="consistent", generation=5, world=2, dead=("w2",), step=44, restored_step=40
        ),
        {
            "kind": "recovered",
            "data": '{"mode": "consistent", "generation": 5, "world": 2, "dead": ["w2"], '
            '"step": 44, "restored_step": 40}',
        },
        report(
            "recovered",
            mode="consistent",
            world=2,
            step=44,
            generation=5,
            dead=["w2"],
            restored_step=40,
        ),
    ),
    (
        RecoveredEvent(
            mode="approximate", generation=6, world=1, dead=("w0",), step=50, restored_step=None
        ),
        {
            "kind": "recovered",
            "data": '{"mode": "approximate", "generation": 6, "world": 1, "dead": ["w0"], '
            '"step": 50, "restored_step": null}',
        },
        report(
            "recovered",
            mode="approximate",
            world=1,
            step=50,
            generation=6,
            dead=["w0"],
            restored_step=None,
        ),
    ),
    (
        ProfileDoneEvent(curve={"4": 30.0, "2": 17.5, "3": 25.25}),
        {"kind": "profile_done", "data": '{"curve": {"4": 30.0, "2": 17.5, "3": 25.25}}'},
        report(
            "profile_done",
            curve=[
                {"workers": 2, "samples_per_s": 17.5},
                {"workers": 3, "samples_per_s": 25.25},
                {"workers": 4, "samples_per_s": 30.0},
            ],
        ),
    ),
    (
        FinishedEvent(step=100, reason="finished"),
        {"kind": "finished", "data": '{"step": 100, "reason": "finished"}'},
        report("finished", step=100, reason="finished"),
    ),
    (
        FinishedEvent(step=60, reason="stopped"),
        {"kind": "finished", "data": '{"step": 60, "reason": "stopped"}'},
        report("finished", step=60, reason="stopped"),
    ),
    (
        FailedEvent(worker="w0", error="CUDA error: out of memory"),
        {"kind": "failed", "data": '{"worker": "w0", "error": "CUDA error: out of memory"}'},
        report("failed", error="CUDA error: out of memory", final=False),
    ),
    (
        CheckpointSavedEvent(
            step=50,
            path="checkpoints/step-000000050.pt",
            size=1234,
            sha256=SHA,
            pruned=("checkpoints/step-000000030.pt",),
        ),
        {
            "kind": "checkpoint_saved",
            "data": '{"step": 50, "path": "checkpoints/step-000000050.pt", "size": 1234, '
            f'"sha256": "{SHA}", "final": false, "pruned": ["checkpoints/step-000000030.pt"]}}',
        },
        report(
            "artifact_stored",
            kind="checkpoint",
            path="checkpoints/step-000000050.pt",
            size=1234,
            sha256=SHA,
            step=50,
            name="step-000000050.pt",
            pruned=["checkpoints/step-000000030.pt"],
        ),
    ),
    (
        CheckpointSavedEvent(
            step=100, path="checkpoints/step-000000100.pt", size=99, sha256=SHA, final=True
        ),
        {
            "kind": "checkpoint_saved",
            "data": '{"step": 100, "path": "checkpoints/step-000000100.pt", "size": 99, '
            f'"sha256": "{SHA}", "final": true, "pruned": []}}',
        },
        report(
            "artifact_stored",
            kind="final",
            path="checkpoints/step-000000100.pt",
            size=99,
            sha256=SHA,
            step=100,
            name="step-000000100.pt",
            pruned=[],
        ),
    ),
    (
        CheckpointSkippedEvent(step=40, reason="sha256 mismatch"),
        {"kind": "checkpoint_skipped", "data": '{"step": 40, "reason": "sha256 mismatch"}'},
        report("checkpoint_skipped", step=40, reason="sha256 mismatch"),
    ),
    (
        ArtifactSavedEvent(
            name="eval/model.onnx", path="artifacts/eval/model.onnx", size=3, sha256=SHA, step=9
        ),
        {
            "kind": "artifact_saved",
            "data": '{"name": "eval/model.onnx", "path": "artifacts/eval/model.onnx", "size": 3, '
            f'"sha256": "{SHA}", "step": 9}}',
        },
        report(
            "artifact_stored",
            kind="user",
            path="artifacts/eval/model.onnx",
            size=3,
            sha256=SHA,
            step=9,
            name="eval/model.onnx",
            pruned=[],
        ),
    ),
    (
        ArtifactSavedEvent(name="notes.txt", path="artifacts/notes.txt", size=0, sha256=SHA),
        {
            "kind": "artifact_saved",
            "data": '{"name": "notes.txt", "path": "artifacts/notes.txt", "size": 0, '
            f'"sha256": "{SHA}", "step": null}}',
        },
        report(
            "artifact_stored",
            kind="user",
            path="artifacts/notes.txt",
            size=0,
            sha256=SHA,
            step=None,
            name="notes.txt",
            pruned=[],
        ),
    ),
    (
        MetricsEvent(
            points=(
                MetricPoint(step=1, values={"loss": 0.5, "acc": 0.25}),
                MetricPoint(step=2, values={"val/loss": 0.4}),
            )
        ),
        {
            "kind": "metrics",
            "data": '{"points": [{"step": 1, "values": {"loss": 0.5, "acc": 0.25}}, '
            '{"step": 2, "values": {"val/loss": 0.4}}]}',
        },
        report(
            "metrics",
            points=[
                {"step": 1, "values": {"loss": 0.5, "acc": 0.25}},
                {"step": 2, "values": {"val/loss": 0.4}},
            ],
        ),
    ),
]

KINDS = sorted({entry["kind"] for _event, entry, _report in GOLDEN})


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """Raw bytes, as the agent reads the stream."""
    connection = redis.Redis.from_url(redis_url, decode_responses=False)
    yield connection
    connection.close()


@pytest.fixture
def keys(client: redis.Redis) -> Iterator[JobKeys]:
    keys = JobKeys(f"wire-{uuid.uuid4().hex[:8]}")
    yield keys
    client.delete(keys.events)


def made_report(fields: dict[Any, Any]) -> dict[str, Any]:
    """What the agent sends for one raw entry, without the time of sending."""
    made = report_from_event("n1", "j1", "7-0", decode_entry(fields))
    assert made is not None
    out = made.to_dict()
    out.pop("at")
    return out


@pytest.mark.parametrize(
    ("event", "entry", "expected"),
    GOLDEN,
    ids=[f"{entry['kind']}-{i}" for i, (_e, entry, _r) in enumerate(GOLDEN)],
)
def test_each_event_goes_into_redis_and_to_the_portal_as_it_always_did(
    client: redis.Redis,
    keys: JobKeys,
    event: RuntimeEvent,
    entry: dict[str, str],
    expected: dict[str, Any],
) -> None:
    publish(client, keys, event)
    stored: Any = client.xrange(keys.events)
    [(_id, fields)] = stored
    assert {k.decode(): v.decode() for k, v in fields.items()} == entry
    assert made_report(fields) == expected


def test_every_kind_the_runtime_writes_has_a_golden() -> None:
    assert sorted(EVENT_KINDS) == KINDS


def read(kind: str, body: dict[str, Any]) -> dict[str, Any] | str:
    """The report the agent makes of an entry the runtime never writes, or its refusal."""
    try:
        made = report_from_event("n1", "j1", "7-0", {"kind": kind, **body})
    except ProtocolError as exc:
        return str(exc)
    assert made is not None
    out = made.to_dict()
    out.pop("at")
    return out


NOTHING_SAID = {"world": None, "step": None, "generation": None}

LENIENT: list[tuple[str, dict[str, Any], dict[str, Any] | str]] = [
    (
        "progress",
        {"step": 3, "samples_per_s": 2, "loss": math.nan, "world": 1},
        report("progress", step=3, samples_per_s=2.0, world=1, loss=None, generation=None),
    ),
    (
        "progress",
        {"step": 3, "samples_per_s": 2.5, "loss": True, "world": 1, "generation": "x", "x": [1]},
        report("progress", step=3, samples_per_s=2.5, world=1, loss=None, generation=None),
    ),
    (
        "progress",
        {"step": 1, "samples_per_s": "x", "world": 1},
        "runtime event progress is malformed: progress.samples_per_s must be a number",
    ),
    ("progress", {"samples_per_s": 1.0, "world": 1}, "runtime event progress lacks field 'step'"),
    (
        "scale_done",
        {},
        report(
            "scale_done",
            **NOTHING_SAID,
            workers=[],
            joiners=[],
            leavers=[],
            pause_s=None,
            new_leader=None,
        ),
    ),
    (
        "scale_done",
        {"members": [1, "w1"], "new_leader": 5, "pause_s": "slow", "world": 2.5, "step": True},
        report(
            "scale_done",
            **NOTHING_SAID,
            workers=["1", "w1"],
            joiners=[],
            leavers=[],
            pause_s=None,
            new_leader="5",
        ),
    ),
    (
        "scale_done",
        {"members": "w0"},
        "runtime event scale_done is malformed: a list of worker ids was expected",
    ),
    ("straggler", {"worker": 7, "ratio": 2}, report("straggler", worker_id="7", ratio=2.0)),
    ("straggler", {"worker": "w1"}, "runtime event straggler lacks field 'ratio'"),
    (
        "worker_failed",
        {"worker": "w1", "error": "gone", "generation": None},
        report("worker_failed", worker_id="w1", error="gone", generation=None),
    ),
    ("worker_failed", {"generation": 1}, "runtime event worker_failed lacks field 'worker'"),
    (
        "recovered",
        {"survivors": [], "left": ["w0"]},
        report("recovered", mode="", **NOTHING_SAID, dead=[], restored_step=None),
    ),
    (
        "recovered",
        {"mode": 3, "dead": None, "restored_step": "x"},
        report("recovered", mode="3", **NOTHING_SAID, dead=[], restored_step=None),
    ),
    (
        "profile_done",
        {"curve": [[2, 9.5], {"workers": 1, "samples_per_s": 5}]},
        report(
            "profile_done",
            curve=[{"workers": 1, "samples_per_s": 5.0}, {"workers": 2, "samples_per_s": 9.5}],
        ),
    ),
    (
        "profile_done",
        {"curve": {"two": 1.0}},
        "runtime event profile_done is malformed: invalid literal for int() with base 10: 'two'",
    ),
    (
        "profile_done",
        {"curve": 5},
        "runtime event profile_done is malformed: profile_done.curve must be an object or a list",
    ),
    ("profile_done", {}, "runtime event profile_done lacks field 'curve'"),
    ("finished", {}, report("finished", step=None, reason="finished")),
    ("finished", {"step": "9", "reason": 4}, report("finished", step=None, reason="4")),
    ("failed", {}, report("failed", error="", final=False)),
    (
        "failed",
        {"worker": "w0", "error": {"a": 1}},
        report("failed", error="{'a': 1}", final=False),
    ),
    (
        "checkpoint_saved",
        {"path": "checkpoints/a.pt", "size": 1, "sha256": SHA, "final": "yes", "step": -1},
        "runtime event checkpoint_saved is malformed: artifact_stored.step must be at least 0, "
        "not -1",
    ),
    (
        "checkpoint_saved",
        {"path": "logs/x", "size": 1, "sha256": SHA, "final": True, "pruned": None},
        report(
            "artifact_stored",
            kind="final",
            path="logs/x",
            size=1,
            sha256=SHA,
            step=None,
            name="x",
            pruned=[],
        ),
    ),
    (
        "checkpoint_saved",
        {"path": "checkpoints/a.pt", "size": 1, "sha256": SHA, "final": "yes"},
        report(
            "artifact_stored",
            kind="checkpoint",
            path="checkpoints/a.pt",
            size=1,
            sha256=SHA,
            step=None,
            name="a.pt",
            pruned=[],
        ),
    ),
    (
        "checkpoint_saved",
        {"path": "../x", "size": 1, "sha256": SHA},
        "runtime event checkpoint_saved is malformed: artifact_stored.path must be a relative "
        "path without '..', not '../x'",
    ),
    ("checkpoint_saved", {"size": 1}, "runtime event checkpoint_saved lacks field 'path'"),
    (
        "checkpoint_saved",
        {"path": "checkpoints/a.pt", "size": 1, "sha256": SHA, "pruned": "x"},
        "runtime event checkpoint_saved is malformed: a list of worker ids was expected",
    ),
    (
        "artifact_saved",
        {"path": "artifacts/" + "n" * 300, "size": 2, "sha256": SHA},
        report(
            "artifact_stored",
            kind="user",
            path="artifacts/" + "n" * 300,
            size=2,
            sha256=SHA,
            step=None,
            name=("artifacts/" + "n" * 300)[:255],
            pruned=[],
        ),
    ),
    (
        "artifact_saved",
        {"name": "", "path": "checkpoints/x", "size": 2, "sha256": SHA, "step": 1.5},
        report(
            "artifact_stored",
            kind="user",
            path="checkpoints/x",
            size=2,
            sha256=SHA,
            step=None,
            name="checkpoints/x",
            pruned=[],
        ),
    ),
    (
        "artifact_saved",
        {"name": "x", "size": 2, "sha256": SHA},
        "runtime event artifact_saved lacks field 'path'",
    ),
    (
        "checkpoint_skipped",
        {"step": 4, "reason": "r" * 600},
        report("checkpoint_skipped", step=4, reason="r" * 500),
    ),
    ("checkpoint_skipped", {"step": 4}, report("checkpoint_skipped", step=4, reason="")),
    (
        "checkpoint_skipped",
        {"reason": "x"},
        "runtime event checkpoint_skipped lacks field 'step'",
    ),
    (
        "metrics",
        {"points": [{"step": 1, "values": {"loss": 1.0}, "extra": 1}]},
        report("metrics", points=[{"step": 1, "values": {"loss": 1.0}}]),
    ),
    (
        "metrics",
        {"points": []},
        "runtime event metrics is malformed: metrics.points must not be empty",
    ),
    (
        "metrics",
        {"points": {"step": 1}},
        "runtime event metrics is malformed: metrics.points must be a list",
    ),
    (
        "metrics",
        {"points": [3]},
        "runtime event metrics is malformed: metrics.points must hold objects",
    ),
    ("metrics", {"points": [{"step": 1}]}, "runtime event metrics lacks field 'values'"),
    (
        "metrics",
        {"points": [{"step": -1, "values": {"loss": 1.0}}]},
        "runtime event metrics is malformed: step must be at least 0, not -1",
    ),
    (
        "metrics",
        {"points": [{"step": 1, "values": {}}]},
        "runtime event metrics is malformed: values must name at least one metric",
    ),
]


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    LENIENT,
    ids=[f"{kind}-{i}" for i, (kind, _b, _e) in enumerate(LENIENT)],
)
def test_what_the_agent_makes_of_entries_the_runtime_never_writes(
    kind: str, body: dict[str, Any], expected: dict[str, Any] | str
) -> None:
    assert read(kind, body) == expected


def test_more_metric_points_than_a_report_holds_are_thinned_evenly() -> None:
    points = [{"step": i, "values": {"loss": 1.0}} for i in range(450)]
    made = read("metrics", {"points": points})
    assert isinstance(made, dict)
    assert [p["step"] for p in made["points"]] == list(range(0, 450, 3))
