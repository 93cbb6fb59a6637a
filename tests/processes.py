"""Stopping the process groups that tests start (a Celery worker and its pool's children).

A Celery worker's warm shutdown (SIGTERM) waits for its running tasks and its broker
connection; on a loaded CI machine that once took over 30 s, long after the test had
its answer. Tests that start a worker with ``start_new_session=True`` stop its whole
group here: a grace period for the warm shutdown, then SIGKILL, so that no pool child
outlives the test and no test fails on how long a shutdown took.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["stop_group"]


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """End ``process`` and its session's group: SIGTERM, ``grace_s`` seconds, then SIGKILL.

    ``process`` must have been started with ``start_new_session=True`` (its pid is its
    group's id). Returns when the leader has been reaped.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the pool's children, and a stuck leader
    process.wait(timeout=30)
