"""Atomic checkpoints of an elastic job: ``{dir}/{job}/step-{S:09d}.pt`` plus ``latest``.

Written by rank 0 of the current generation (all members hold the same
state). Atomic: written to a temporary file, fsynced, then renamed, and the
``latest`` pointer is replaced the same way, so a crash leaves either the old
or the new checkpoint, never half of one. The two newest are kept.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

KEEP = 2


def job_dir(root: str, job_id: str) -> Path:
    return Path(root) / job_id


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save(root: str, job_id: str, step: int, state: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step`` and point ``latest`` at it."""
    directory = job_dir(root, job_id)
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"step": step, **state}, buffer)
    path = directory / f"step-{step:09d}.pt"
    _atomic_write(path, buffer.getvalue())
    _atomic_write(directory / "latest", path.name.encode())
    for old in sorted(directory.glob("step-*.pt"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_latest(root: str, job_id: str) -> dict[str, Any] | None:
    """The newest complete checkpoint of the job, or None."""
    directory = job_dir(root, job_id)
    try:
        name = (directory / "latest").read_text().strip()
    except OSError:
        return None
    state: dict[str, Any] = torch.load(directory / name, map_location="cpu", weights_only=False)
    return state


def latest_step(root: str, job_id: str) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    try:
        name = (job_dir(root, job_id) / "latest").read_text().strip()
    except OSError:
        return None
    return int(name.removeprefix("step-").removesuffix(".pt"))


def load_step(root: str, job_id: str, step: int) -> dict[str, Any]:
    """The checkpoint of exactly ``step`` (recovery names the one every survivor loads)."""
    path = job_dir(root, job_id) / f"step-{step:09d}.pt"
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state
