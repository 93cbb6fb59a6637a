"""What the runtime's modules share: timings of the lease and liveness, the log line, the error.

Kept apart so that the context, the leader and their helpers depend on it
and not on one another.
"""

from __future__ import annotations

import sys
import time

LEASE_MS = 3000
"""Lifetime of the leader lease (``edl:{job}:leader``) unless refreshed."""

ALIVE_MS = 3000
"""Lifetime of a worker's liveness key unless refreshed."""

BEAT_S = 0.5
"""How often a worker refreshes its liveness key (and the leader its lease)."""

JOIN_WAIT_S = 600.0
"""How long a ready newcomer waits for its switch (and a left state is kept)."""

CTRL_FIXED = 3
"""Leading slots of the control vector: plan seq, loss sum, sample count; then one
compute time per rank."""

FINISHED = "__finished__"
"""Tombstone value of the lease once a job ended, so that late peers do not take over."""


class ElasticError(RuntimeError):
    """The job cannot continue on this worker."""


class JobEnded(ElasticError):
    """The job ended before this worker could join it: nothing to do, a clean exit."""


def log(worker: str, message: str) -> None:
    """One line on the worker's stderr (the agent keeps it in the process log)."""
    sys.stderr.write(f"[edl {worker} {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()
