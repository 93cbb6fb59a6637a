"""What a program hands the job besides its model: files (artifacts) and training metrics.

::

    ctx.save_artifact("model.onnx")          ─▶ <job store>/artifacts/model.onnx ─▶ artifact_saved
    ctx.log_metrics(step, accuracy=0.93)     ─▶ buffer ─(at most once a second, and at the end)─▶ metrics

Both end up in the job's event stream, which the node agent forwards to the
control plane (the job page's files and charts).  Metrics are rate-limited on
the injected clock so that a loop logging every mini-batch costs one Redis
write a second, not one a step.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import redis

from workers.artifacts import ArtifactPathError, StoredObject, check_relative
from workers.clock import Clock
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.runtime_events import (
    MAX_POINTS_PER_EVENT,
    ArtifactSavedEvent,
    MetricPoint,
    MetricsEvent,
)
from workers.store_door import ObjectStore

ARTIFACTS = "artifacts"
"""The folder of a program's files in the job's store."""

METRICS_EVERY_S = 1.0
"""At most one ``metrics`` event per this many seconds (a full buffer goes out at once)."""

MAX_NAME = 512


def check_artifact_name(name: str) -> str:
    """``name`` if it can name a file under ``artifacts/``; ``ValueError`` saying why not.

    A name is a relative POSIX path (``model.pt``, ``eval/confusion.png``):
    no ``..``, no leading ``/``, no backslash, no empty or hidden parts.
    """
    try:
        normal = check_relative(name)
    except ArtifactPathError as exc:
        raise ValueError(f"artifact name: {exc}") from None
    parts = name.split("/")
    if normal != name or len(name) > MAX_NAME or any(p.startswith(".") for p in parts):
        raise ValueError(
            f"artifact name {name!r}: use a relative path of at most {MAX_NAME} characters "
            "without empty, '.' or hidden parts"
        )
    if not name.isprintable():
        raise ValueError(f"artifact name {name!r} has unprintable characters")
    return name


class ProgramOutputs:
    """A worker's uploads to the job's store and its buffered metrics."""

    def __init__(self, store: ObjectStore, client: redis.Redis, keys: JobKeys, clock: Clock):
        self.store = store
        self.redis = client
        self.keys = keys
        self.clock = clock
        self._pending: list[MetricPoint] = []
        self._last_flush = -math.inf
        self._lock = threading.Lock()

    def save_artifact(
        self, path: str | os.PathLike[str], name: str | None, step: int | None
    ) -> StoredObject:
        """Upload the local file ``path`` as ``artifacts/<name or its base name>``; announce it."""
        local = Path(path)
        if not local.is_file():
            raise FileNotFoundError(f"save_artifact: no file {str(local)!r}")
        chosen = check_artifact_name(local.name if name is None else name)
        stored = self.store.put_file(f"{ARTIFACTS}/{chosen}", local)
        event = ArtifactSavedEvent(
            name=chosen, path=stored.path, size=stored.size, sha256=stored.sha256, step=step
        )
        publish(self.redis, self.keys, event)
        return stored

    def log_metrics(self, step: int, values: dict[str, float], publish_it: bool = True) -> None:
        """Check one point (``ProtocolError``, a ``ValueError``); buffer it if ``publish_it``.

        The buffer goes out when a second has passed since the last ``metrics``
        event, or when it holds the most one event may carry.
        """
        point = MetricPoint(step=step, values=values)
        with self._lock:
            if publish_it:
                self._pending.append(point)
            due = self.clock.monotonic() - self._last_flush >= METRICS_EVERY_S
            if self._pending and (due or len(self._pending) >= MAX_POINTS_PER_EVENT):
                self._flush_locked()

    def flush(self) -> None:
        """Publish the buffered points now (at the end of training)."""
        with self._lock:
            if self._pending:
                self._flush_locked()

    def _flush_locked(self) -> None:
        points, self._pending = tuple(self._pending), []
        self._last_flush = self.clock.monotonic()
        publish(self.redis, self.keys, MetricsEvent(points=points))
