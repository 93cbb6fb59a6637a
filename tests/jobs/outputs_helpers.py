"""Helpers for tests of what jobs produce: jobs, reports as agents send them, a file store."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

from django.test import override_settings

from control.reports import handle_report
from jobs.agent_commands import runtime_job_name
from jobs.artifacts import prefix_of
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from workers.artifacts import ArtifactStore
from workers.protocol import ArtifactStored, CheckpointSkipped, MetricPoint, Metrics

_IDS = itertools.count(1)


def submit(user: Any, tenant: Any, name: str = "outputs") -> Job:
    """A queued job of ``tenant``."""
    data = {"name": name, "workload": "mlp-digits", "gpus": 1}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def event_id() -> str:
    """A fresh runtime event id, newer than every earlier one."""
    return f"1700000000000-{next(_IDS)}"


def stored(job: Job, path: str, data: bytes = b"x", **fields: Any) -> str:
    """Report ``artifact_stored`` for ``path``; returns the outcome."""
    kind = fields.pop("kind", "checkpoint" if path.startswith("checkpoints/") else "user")
    report = ArtifactStored(
        node="node-0",
        job=runtime_job_name(job.pk),
        event_id=fields.pop("event_id", None) or event_id(),
        kind=kind,
        path=path,
        size=fields.pop("size", len(data)),
        sha256=fields.pop("sha256", hashlib.sha256(data).hexdigest()),
        **fields,
    )
    return handle_report(report.to_dict())


def hostile_stored(job: Job, **raw: Any) -> str:
    """Send an ``artifact_stored`` payload with ``raw`` fields as a rogue agent could."""
    payload = ArtifactStored(
        node="node-0",
        job=runtime_job_name(job.pk),
        event_id=event_id(),
        kind="checkpoint",
        path="checkpoints/step-000000001.pt",
        size=1,
        sha256=hashlib.sha256(b"x").hexdigest(),
    ).to_dict()
    payload.update(raw)
    return handle_report(payload)


def skipped(job: Job, step: int, reason: str) -> str:
    """Report ``checkpoint_skipped``."""
    report = CheckpointSkipped(
        node="node-0", job=runtime_job_name(job.pk), event_id=event_id(), step=step, reason=reason
    )
    return handle_report(report.to_dict())


def metrics(job: Job, points: list[tuple[int, dict[str, float]]], **fields: Any) -> str:
    """Report ``metrics`` with ``points`` as (step, values)."""
    report = Metrics(
        node="node-0",
        job=runtime_job_name(job.pk),
        event_id=fields.pop("event_id", None) or event_id(),
        points=tuple(MetricPoint(step=s, values=v) for s, v in points),
    )
    return handle_report(report.to_dict())


def put_object(store_dir: Path, job: Job, job_path: str, data: bytes) -> str:
    """Store ``data`` at ``job_path`` of ``job``'s prefix in the file store; its full path."""
    full = f"{prefix_of(job)}/{job_path}"
    target = store_dir / full
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return full


def file_store(tmp_path: Path) -> tuple[Path, Any, ArtifactStore]:
    """A store directory, the settings override naming it, and the store."""
    root = tmp_path / "store"
    root.mkdir()
    return root, override_settings(ARTIFACT_URL=f"file://{root}"), ArtifactStore(f"file://{root}")
