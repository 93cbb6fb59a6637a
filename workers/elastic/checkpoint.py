"""Checkpoints of an elastic job in the artifact store, where any node can resume them.

::

    <job store>/checkpoints/
        step-000000040.pt      torch.save of the training snapshot (tensors and plain data)
        step-000000040.json    its manifest, written AFTER the .pt:
                               {"step", "file", "size", "sha256", "final", "saved_at"}
        step-000000050.pt      a .pt without a manifest: a save that never completed (ignored)

    save:  .pt (atomic) ─▶ manifest (atomic) ─▶ prune by the keep rule (manifest first, then .pt)
    load:  manifests, newest first ─▶ size + sha256 of the .pt ─▶ torch.load(weights_only)
                                          └─ mismatch or unreadable: skipped, try the next older

Written by rank 0 of the current generation (all members hold the same
state); read by whichever worker starts or recovers the job, on any node,
because the store (a shared directory or S3) is the same for all of them.
The keep rule (``to_prune``) keeps the newest ``keep`` checkpoints plus the
newest final one, and drops any newer than the one just written: those belong
to a timeline the job abandoned (they failed their check on load).
Loading uses ``weights_only=True``: tenants' programs write this store, so
nothing in it may run code when loaded.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from workers.artifacts import ArtifactCorrupt, ArtifactStore, StoredObject
from workers.clock import SYSTEM_CLOCK, Clock
from workers.store_door import ObjectStore

FOLDER = "checkpoints"
"""The checkpoints' folder in the job's store."""

KEEP = 2
"""Non-final checkpoints kept by default (``CHECKPOINT_KEEP``)."""

_NAME = re.compile(r"step-(\d{9,})\.(pt|json)")


def pt_path(step: int) -> str:
    """The job-relative path of the checkpoint of ``step``."""
    return f"{FOLDER}/step-{step:09d}.pt"


def manifest_path(step: int) -> str:
    """The job-relative path of the manifest of the checkpoint of ``step``."""
    return f"{FOLDER}/step-{step:09d}.json"


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint is: written after its ``.pt``, so its presence means the save completed."""

    step: int
    file: str
    size: int
    sha256: str
    final: bool
    saved_at: float

    @property
    def path(self) -> str:
        """The job-relative path of the checkpoint it describes."""
        return f"{FOLDER}/{self.file}"

    def to_json(self) -> bytes:
        """The manifest file's bytes."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse a manifest; ``ValueError`` if it is not one."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("a manifest must be a JSON object")
        manifest = cls(
            step=_typed(raw, "step", int),
            file=_typed(raw, "file", str),
            size=_typed(raw, "size", int),
            sha256=_typed(raw, "sha256", str),
            final=_typed(raw, "final", bool),
            saved_at=float(_typed(raw, "saved_at", (int, float))),
        )
        if manifest.path != pt_path(manifest.step):
            raise ValueError(f"manifest of step {manifest.step} names {manifest.file!r}")
        return manifest


def _typed(raw: dict[str, Any], name: str, kind: Any) -> Any:
    value = raw.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"manifest field {name!r} is missing or of the wrong type")
    return value


@dataclass(frozen=True)
class Saved:
    """A checkpoint just written: the stored ``.pt`` (job-relative) and what the keep rule pruned."""

    stored: StoredObject
    step: int
    final: bool
    pruned: tuple[str, ...]


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over on load, and why."""

    step: int
    reason: str


@dataclass(frozen=True)
class Restored:
    """A checkpoint loaded back: its step and the training snapshot it holds."""

    step: int
    state: dict[str, Any]


def to_prune(manifests: Sequence[Manifest], keep: int, saved_step: int) -> set[int]:
    """The steps whose checkpoints go once ``saved_step`` is saved (the keep rule, pure).

    Kept: the newest ``keep`` non-final checkpoints up to ``saved_step`` and the
    newest final one.  Everything else goes, newer ones included.
    """
    current = [m for m in manifests if m.step <= saved_step]
    regular = sorted((m.step for m in current if not m.final), reverse=True)[:keep]
    finals = sorted((m.step for m in current if m.final), reverse=True)[:1]
    kept = set(regular) | set(finals)
    return {m.step for m in manifests} - kept


class Checkpoints:
    """The checkpoints of one job, in its store (``<store>/checkpoints/``)."""

    def __init__(self, store: ObjectStore, keep: int = KEEP, clock: Clock = SYSTEM_CLOCK):
        if keep < 1:
            raise ValueError("keep at least one checkpoint: recovery goes back to it")
        self.store = store
        self.keep = keep
        self.clock = clock

    # -- writing -------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], *, final: bool = False) -> Saved:
        """Write the checkpoint of ``step`` (``.pt``, then its manifest), then prune."""
        buffer = io.BytesIO()
        torch.save({**state, "step": step}, buffer)
        stored = self.store.put_bytes(pt_path(step), buffer.getvalue())
        manifest = Manifest(
            step=step,
            file=stored.path.rpartition("/")[2],
            size=stored.size,
            sha256=stored.sha256,
            final=final,
            saved_at=self.clock.now(),
        )
        self.store.put_bytes(manifest_path(step), manifest.to_json())
        return Saved(stored=stored, step=step, final=final, pruned=self.prune(step))

    def prune(self, saved_step: int) -> tuple[str, ...]:
        """Apply the keep rule after saving ``saved_step``; return the ``.pt`` paths deleted.

        Also deletes ``.pt`` files of other steps that never got a manifest.
        """
        manifests, _ = self.manifests()
        doomed = to_prune(manifests, self.keep, saved_step)
        described = {m.step for m in manifests}
        pruned = []
        for step, kinds in sorted(self._steps_on_disk().items()):
            if step == saved_step or (step in described and step not in doomed):
                continue
            # the manifest first: a reader never finds a manifest without its file
            if "json" in kinds:
                self.store.delete(manifest_path(step))
            if "pt" in kinds:
                self.store.delete(pt_path(step))
                pruned.append(pt_path(step))
        return tuple(pruned)

    # -- reading -------------------------------------------------------------------------
    def manifests(self) -> tuple[list[Manifest], list[Skipped]]:
        """The complete checkpoints, newest first, and the manifests that do not parse."""
        found, bad = [], []
        for step, kinds in self._steps_on_disk().items():
            if "json" not in kinds:
                continue  # incomplete: its save never finished
            try:
                found.append(Manifest.from_json(self._read_small(manifest_path(step))))
            except (ValueError, OSError) as exc:
                bad.append(Skipped(step, f"manifest unreadable: {exc}"[:300]))
        found.sort(key=lambda m: m.step, reverse=True)
        return found, bad

    def latest(self) -> tuple[Manifest | None, list[Skipped]]:
        """The newest checkpoint whose bytes verify (size + sha256), and those skipped before it."""
        manifests, skipped = self.manifests()
        for manifest in manifests:
            try:
                self.store.read_verified(manifest.path, manifest.size, manifest.sha256)
            except (ArtifactCorrupt, OSError) as exc:
                skipped.append(Skipped(manifest.step, str(exc)[:300]))
                continue
            return manifest, skipped
        return None, skipped

    def load_latest(self) -> tuple[Restored | None, list[Skipped]]:
        """The newest checkpoint that verifies and loads, and those skipped before it."""
        manifests, skipped = self.manifests()
        for manifest in manifests:
            try:
                return Restored(manifest.step, self._load(manifest)), skipped
            except Exception as exc:  # corrupt, unreadable, refused by weights_only: older one
                skipped.append(Skipped(manifest.step, str(exc)[:300]))
        return None, skipped

    def load_step(self, step: int) -> dict[str, Any]:
        """The checkpoint of exactly ``step``, verified (recovery names the one all load).

        Raises ``FileNotFoundError`` without a manifest, ``ArtifactCorrupt`` if
        the bytes are not the ones the manifest describes.
        """
        manifest = Manifest.from_json(self._read_small(manifest_path(step)))
        return self._load(manifest)

    def _load(self, manifest: Manifest) -> dict[str, Any]:
        data = self.store.read_verified(manifest.path, manifest.size, manifest.sha256)
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("step") != manifest.step:
            raise ArtifactCorrupt(f"{manifest.path} is not the checkpoint of step {manifest.step}")
        return state

    def _read_small(self, rel: str) -> bytes:
        with self.store.open_read(rel) as stream:
            return stream.read(1 << 16)

    def _steps_on_disk(self) -> dict[int, set[str]]:
        """Per step, which of its files (``pt``, ``json``) are stored."""
        steps: dict[int, set[str]] = {}
        for rel in self.store.list(FOLDER):
            match = _NAME.fullmatch(rel.rpartition("/")[2])
            if match is not None and rel.count("/") == 1:
                steps.setdefault(int(match.group(1)), set()).add(match.group(2))
        return steps


# -- for scripts that keep one job's checkpoints per sub-directory (the benchmark's baseline)
def save(root: str, job_id: str, step: int, state: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step`` in ``<root>/<job_id>/checkpoints/``."""
    saved = Checkpoints(ArtifactStore(str(Path(root) / job_id))).save(step, state)
    return Path(root) / job_id / saved.stored.path


def load_latest(root: str, job_id: str) -> dict[str, Any] | None:
    """The newest checkpoint that verifies in ``<root>/<job_id>/checkpoints/``, or None."""
    restored, _ = Checkpoints(ArtifactStore(str(Path(root) / job_id))).load_latest()
    return None if restored is None else restored.state
