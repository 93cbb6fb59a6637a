"""A job's objects in the artifact store, and the rows that record them.

::

    tenants/<slug>/jobs/<pk>/          job_prefix(slug, pk): everything the job stores
        checkpoints/step-N.pt (+ .json manifest)   kind checkpoint, or final
        artifacts/<name>                           kind user
        logs/job.log                               kind log (jobs.logs.export)

The only writer of :class:`~jobs.models.Artifact` rows.  A row's ``path`` is
always ``job_prefix(...) + "/" + <job-relative path>``, the prefix taken from
the database: what a report says can only choose the part after it, and
``workers.outputs.check_job_path`` has already kept that part inside one of
the job's folders.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import F

from jobs.choices import ArtifactKind
from jobs.models import Artifact, Job
from workers.artifacts import ArtifactCorrupt, ArtifactStore, at_most, job_prefix

if TYPE_CHECKING:
    from workers.elastic.checkpoint import Manifest

FOLDER_OF_KIND: dict[str, str] = {
    ArtifactKind.CHECKPOINT: "checkpoints",
    ArtifactKind.FINAL: "checkpoints",
    ArtifactKind.USER: "artifacts",
    ArtifactKind.LOG: "logs",
}
"""The folder of the job's prefix that each kind of object lives in."""

CHECKPOINT_FOLDER = "checkpoints"
"""The folder of a job's prefix with its checkpoints (the runtime's, or a program's own)."""

MAX_COPIED_FILES = 1000
"""The most files a resume copies of a program's own checkpoints (no manifests)."""

LOG_PATH = "logs/job.log"
"""Where a finished job's whole log is written, relative to its prefix."""


__all__ = ["job_prefix"]  # re-exported: the rule lives in workers.artifacts


def prefix_of(job: Job) -> str:
    """The store prefix of ``job``'s objects."""
    return job_prefix(job.tenant.slug, job.pk)


def artifact_store() -> ArtifactStore:
    """The cluster's artifact store (``ARTIFACT_URL``)."""
    return ArtifactStore(settings.ARTIFACT_URL)


def manifest_path(path: str) -> str | None:
    """The manifest stored next to a checkpoint (``step-N.pt`` → ``step-N.json``), if any."""
    return path.removesuffix(".pt") + ".json" if path.endswith(".pt") else None


def record_artifact(
    *,
    job: Job,
    kind: str,
    job_path: str,
    size: int,
    sha256: str,
    at: datetime,
    step: int | None = None,
    name: str = "",
) -> Artifact:
    """Record that ``job`` stored an object at ``job_path`` (relative to its prefix).

    A second report of the same path updates the row (a rewritten object),
    keeping its creation time.
    """
    fields = {
        "kind": kind,
        "name": name or job_path.rsplit("/", 1)[-1],
        "step": step,
        "size": size,
        "sha256": sha256,
    }
    artifact, _ = Artifact.objects.update_or_create(
        job=job,
        path=f"{prefix_of(job)}/{job_path}",
        defaults=fields,
        create_defaults={**fields, "created_at": at},
    )
    return artifact


def forget_paths(job: Job, job_paths: Iterable[str]) -> int:
    """Delete the rows of objects the job itself deleted (its keep rule); returns how many."""
    prefix = prefix_of(job)
    paths = [f"{prefix}/{path}" for path in job_paths]
    if not paths:
        return 0
    deleted, _ = Artifact.objects.filter(job=job, path__in=paths).delete()
    return deleted


def forget_old_checkpoints(job: Job, keep: int) -> int:
    """Delete the rows of checkpoints beyond the newest ``keep`` (the final one never counts).

    The runtime prunes those objects itself; this keeps the table in step
    even when a report's ``pruned`` list was lost or cut short.
    """
    newest_first = Artifact.objects.filter(job=job, kind=ArtifactKind.CHECKPOINT).order_by(
        F("step").desc(nulls_last=True), "-created_at", "-id"
    )
    stale = list(newest_first.values_list("id", flat=True)[max(keep, 0) :])
    if not stale:
        return 0
    deleted, _ = Artifact.objects.filter(id__in=stale).delete()
    return deleted


def forget_artifact(artifact: Artifact) -> None:
    """Delete one row (its object is already gone from the store)."""
    artifact.delete()


@dataclass(frozen=True)
class CopiedCheckpoint:
    """What a resume copied into the new job: the runtime's checkpoint of ``step`` (None: a
    program's own files, ``files`` of them)."""

    step: int | None
    files: int


def checkpoint_manifests(job: Job) -> list[Manifest]:
    """The manifests of ``job``'s complete checkpoints in the store, newest first.

    Reads the manifests (small), never a checkpoint's bytes: those are verified
    once, where they are read (a restore, :func:`copy_newest_checkpoint`).  The
    one reader of a job's manifests for the portal: resuming another job
    (:func:`has_checkpoint`) and requeueing one (``control.resume``) both ask here.
    """
    # torch comes with the checkpoint module: imported only when a job needs its manifests.
    from workers.elastic.checkpoint import Checkpoints

    manifests, _ = Checkpoints(artifact_store().child(prefix_of(job))).manifests()
    return manifests


def has_checkpoint(job: Job) -> bool:
    """Whether ``job``'s store holds something to resume from: a complete checkpoint (its
    manifest written) or a program's own files under ``checkpoints/``.

    Manifests only (:func:`checkpoint_manifests`): a checkpoint of many gigabytes
    read whole into memory at submit would take the web server with it.
    """
    if checkpoint_manifests(job):
        return True
    return bool(artifact_store().child(prefix_of(job)).list(CHECKPOINT_FOLDER))


def copy_newest_checkpoint(source: Job, target: Job, at: datetime) -> CopiedCheckpoint | None:
    """Copy ``source``'s newest complete, verified checkpoint into ``target``'s prefix, where
    ``target``'s runtime (or its program, through ``CHECKPOINT_DIR``) restores it.

    The runtime's checkpoints: the newest whose bytes match its manifest, copied
    as a regular (not final) checkpoint of ``target`` and recorded as its
    artifact.  Without any manifest: the program's own files under ``checkpoints/``
    (a torchrun program's), as they are.  None when there is nothing to copy
    (runtime checkpoints that all fail to verify are not copied as files).
    """
    store = artifact_store()
    src, dst = store.child(prefix_of(source)), store.child(prefix_of(target))
    manifests = checkpoint_manifests(source)
    for manifest in manifests:
        try:
            with src.open_read(manifest.path) as stream:
                stored = dst.put_stream(manifest.path, at_most(stream, manifest.size + 1))
            if (stored.size, stored.sha256) != (manifest.size, manifest.sha256):
                raise ArtifactCorrupt(f"{manifest.path} does not match its manifest")
        except (ArtifactCorrupt, OSError):
            dst.delete(manifest.path)
            continue  # the previous one, as a restore would
        copied: Manifest = replace(manifest, final=False)
        dst.put_bytes(str(manifest_path(copied.path)), copied.to_json())
        record_artifact(
            job=target,
            kind=ArtifactKind.CHECKPOINT,
            job_path=manifest.path,
            size=stored.size,
            sha256=stored.sha256,
            at=at,
            step=manifest.step,
        )
        return CopiedCheckpoint(step=manifest.step, files=1)
    if manifests:  # the runtime's checkpoints, every one corrupt: nothing to resume
        return None
    return _copy_own_files(src, dst)


def _copy_own_files(src: ArtifactStore, dst: ArtifactStore) -> CopiedCheckpoint | None:
    """A program's own checkpoint files (no manifests), copied as they are (bounded)."""
    paths = src.list(CHECKPOINT_FOLDER)[:MAX_COPIED_FILES]
    for path in paths:
        stream, size = src.open_sized(path)
        with stream:
            dst.put_stream(path, at_most(stream, size))
    return CopiedCheckpoint(step=None, files=len(paths)) if paths else None
