"""The reports about what a job produced: only paths inside the job's prefix, only clean metrics."""

from __future__ import annotations

from typing import Any

import pytest

from workers.protocol import ArtifactStored, CheckpointSkipped, Metrics, ProtocolError, Report

SHA = "ab" * 32


def stored(**fields: Any) -> dict[str, Any]:
    base = {
        "type": "artifact_stored",
        "node": "node-0",
        "job": "job-1",
        "event_id": "1-0",
        "kind": "checkpoint",
        "path": "checkpoints/step-000000010.pt",
        "size": 10,
        "sha256": SHA,
        "step": 10,
    }
    return {**base, **fields}


def test_an_artifact_report_round_trips() -> None:
    report = Report.from_dict(stored(pruned=["checkpoints/step-000000000.pt"]))
    assert isinstance(report, ArtifactStored)
    assert Report.from_dict(report.to_dict()) == report


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"path": "../tenants/other/jobs/2/checkpoints/x.pt"}, "artifact_stored.path"),
        ({"path": "/etc/passwd"}, "artifact_stored.path"),
        ({"path": "artifacts/a/../../../x"}, "artifact_stored.path"),
        ({"path": "bundles/x.zip"}, "artifact_stored.path"),
        ({"path": "artifacts"}, "artifact_stored.path"),
        ({"path": "artifacts\\..\\x"}, "artifact_stored.path"),
        ({"pruned": ["../x"]}, "artifact_stored.pruned[0]"),
        ({"sha256": "XYZ"}, "artifact_stored.sha256"),
        ({"size": -1}, "artifact_stored.size"),
        ({"kind": "anything"}, "artifact_stored.kind"),
    ],
)
def test_an_artifact_report_outside_the_job_is_refused(fields: dict[str, Any], names: str) -> None:
    with pytest.raises(ProtocolError, match=names.replace("[", r"\[").replace("]", r"\]")):
        Report.from_dict(stored(**fields))


def metrics(*points: Any) -> dict[str, Any]:
    return {"type": "metrics", "node": "n", "job": "job-1", "event_id": "2-0", "points": points}


def test_metrics_become_floats() -> None:
    report = Report.from_dict(metrics({"step": 3, "values": {"loss": 1, "val/acc": 0.5}}))
    assert isinstance(report, Metrics)
    assert report.points[0].values == {"loss": 1.0, "val/acc": 0.5}


@pytest.mark.parametrize(
    "point",
    [
        {"step": 1, "values": {}},
        {"step": 1, "values": {"9lives": 1.0}},
        {"step": 1, "values": {"loss": "low"}},
        {"step": 1, "values": {"loss": True}},
        {"step": 1, "values": {f"m{i}": 1.0 for i in range(33)}},
        {"step": -1, "values": {"loss": 1.0}},
    ],
)
def test_bad_metrics_are_refused(point: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match=r"metrics\.points\[0\]"):
        Report.from_dict(metrics(point))


def test_too_many_points_or_none_are_refused() -> None:
    with pytest.raises(ProtocolError, match="at most 200"):
        Report.from_dict(metrics(*({"step": i, "values": {"x": 1.0}} for i in range(201))))
    with pytest.raises(ProtocolError, match="must not be empty"):
        Report.from_dict(metrics())


def test_a_skipped_checkpoint_report() -> None:
    report = Report.from_dict(
        {"type": "checkpoint_skipped", "node": "n", "job": "job-1", "event_id": "3-0",
         "step": 20, "reason": "sha256 mismatch"}
    )  # fmt: skip
    assert isinstance(report, CheckpointSkipped) and report.step == 20


@pytest.mark.parametrize(
    "prefix", ["tenants/acme/jobs/7/x", "tenants/../jobs/7", "jobs/7", "a/b/c/d"]
)
def test_a_start_command_refuses_a_prefix_that_is_not_a_job_prefix(prefix: str) -> None:
    from workers.protocol import Command

    with pytest.raises(ProtocolError, match="store_prefix"):
        Command.from_dict(
            {"type": "start_workers", "job": "job-7", "command_id": "c1", "workload": "mlp-digits",
             "batch_size": 8, "recovery": "consistent", "checkpoint_every": 5,
             "workers": [{"worker_id": "w0", "slot": 0}], "initial_world": 1,
             "store_prefix": prefix}
        )  # fmt: skip
