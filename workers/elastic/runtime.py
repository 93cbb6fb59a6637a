"""Placeholder until the runtime lands (next commit)."""

from __future__ import annotations

from workers.elastic.cli import WorkerOptions


def run_worker(options: WorkerOptions) -> int:
    """Run one worker; not yet implemented in this commit."""
    raise NotImplementedError("elastic runtime lands in the next commit")
