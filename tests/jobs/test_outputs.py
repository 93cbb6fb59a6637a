"""Reports of what a job produced: artifact rows, the keep rule, skipped checkpoints, metrics."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from jobs.choices import EventKind
from jobs.models import Artifact, Job, TrainingMetric
from jobs.training_metrics import CAP_NOTE_KEY
from tests.jobs.outputs_helpers import (
    event_id,
    hostile_stored,
    metrics,
    skipped,
    stored,
    submit,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(alice: Any, acme: Any) -> Job:
    return submit(alice, acme)


def ckpt(step: int) -> str:
    return f"checkpoints/step-{step:09d}.pt"


def paths(job: Job) -> list[str]:
    return sorted(Artifact.objects.filter(job=job).values_list("path", flat=True))


def test_a_stored_object_becomes_a_row_under_the_jobs_own_prefix(job: Job) -> None:
    assert stored(job, ckpt(50), b"weights", step=50) == "artifact"
    row = Artifact.objects.get(job=job)
    assert row.path == f"tenants/acme/jobs/{job.pk}/{ckpt(50)}"
    assert row.job_path == ckpt(50)
    assert (row.kind, row.step, row.size, row.name) == ("checkpoint", 50, 7, "step-000000050.pt")


def test_a_re_report_updates_size_and_sha_and_keeps_one_row(job: Job) -> None:
    stored(job, "artifacts/model.onnx", b"first", name="model")
    created = Artifact.objects.get(job=job).created_at
    stored(job, "artifacts/model.onnx", b"second version", name="model")
    row = Artifact.objects.get(job=job)
    assert row.size == len(b"second version")
    assert row.created_at == created
    assert Artifact.objects.filter(job=job).count() == 1


@override_settings(CHECKPOINT_KEEP=2)
def test_pruned_checkpoints_and_those_beyond_the_keep_rule_lose_their_rows(job: Job) -> None:
    stored(job, ckpt(10), step=10)
    stored(job, ckpt(20), step=20)
    stored(job, ckpt(30), step=30, pruned=(ckpt(10), "checkpoints/step-000000010.json"))
    prefix = f"tenants/acme/jobs/{job.pk}/"
    assert paths(job) == [prefix + ckpt(20), prefix + ckpt(30)]
    # pruned list lost: the keep rule alone still keeps the newest two
    stored(job, ckpt(40), step=40)
    stored(job, "artifacts/notes.txt", b"user file")
    stored(job, ckpt(50), step=50, kind="final")
    assert paths(job) == [
        prefix + "artifacts/notes.txt",
        prefix + ckpt(30),
        prefix + ckpt(40),
        prefix + ckpt(50),
    ]
    assert Artifact.objects.get(job=job, step=50).kind == "final"


def test_a_replayed_report_applies_once(job: Job) -> None:
    same = event_id()
    assert stored(job, ckpt(10), step=10, event_id=same) == "artifact"
    assert stored(job, ckpt(20), step=20, event_id=same) == "duplicate"
    assert paths(job) == [f"tenants/acme/jobs/{job.pk}/{ckpt(10)}"]
    point = event_id()
    assert metrics(job, [(1, {"acc": 0.5})], event_id=point) == "metrics"
    assert metrics(job, [(1, {"acc": 0.5})], event_id=point) == "duplicate"
    assert TrainingMetric.objects.filter(job=job).count() == 1


def test_a_hostile_report_cannot_reach_outside_its_jobs_prefix(
    job: Job, alice: Any, globex: Any, make_user: Any
) -> None:
    other = submit(make_user("gina", globex), globex, "victim")
    stored(other, ckpt(10), step=10)
    for path in (
        "../../globex/jobs/1/checkpoints/x.pt",
        f"checkpoints/../../../{other.pk}/checkpoints/x.pt",
        "/tenants/globex/x",
        "bundles/abc.zip",
    ):
        assert hostile_stored(job, path=path).startswith("invalid")
        assert hostile_stored(job, pruned=[path]).startswith("invalid")
    # a pruned path can only name this job's own rows
    assert stored(job, ckpt(20), step=20, pruned=(ckpt(10),)) == "artifact"
    assert paths(other) == [f"tenants/globex/jobs/{other.pk}/{ckpt(10)}"]
    # a kind outside its own folder is refused
    assert stored(job, "artifacts/x.pt", kind="final").startswith("invalid")
    assert all(p.startswith(f"tenants/acme/jobs/{job.pk}/") for p in paths(job))


def test_a_report_for_an_unknown_job_changes_nothing(job: Job) -> None:
    ghost = Job(pk=job.pk + 1000)
    assert stored(ghost, ckpt(10)) == "unknown job"
    assert not Artifact.objects.exists()


def test_a_skipped_checkpoint_is_a_warning_in_the_history(job: Job) -> None:
    assert skipped(job, 40, "sha256 mismatch") == "checkpoint skipped"
    event = job.events.get(kind=EventKind.WARNING)
    assert event.reason == (
        "checkpoint at step 40 failed its checksum (sha256 mismatch): "
        "skipped, resumed from the previous one"
    )


@override_settings(METRICS_MAX_POINTS=5)
def test_metrics_are_stored_up_to_the_cap_and_the_drop_is_noted_once(job: Job) -> None:
    assert metrics(job, [(1, {"acc": 0.1, "lr": 0.01}), (2, {"acc": 0.2, "lr": 0.01})]) == "metrics"
    assert metrics(job, [(3, {"acc": 0.3, "lr": 0.01})]) == "metrics"
    assert metrics(job, [(4, {"acc": 0.4})]) == "metrics dropped"
    stored_values = list(
        TrainingMetric.objects.filter(job=job).order_by("step", "name").values_list("step", "name")
    )
    assert stored_values == [(1, "acc"), (1, "lr"), (2, "acc"), (2, "lr"), (3, "acc")]
    notes = job.events.filter(data__has_key=CAP_NOTE_KEY)
    assert notes.count() == 1
    assert "METRICS_MAX_POINTS" in notes.get().reason
