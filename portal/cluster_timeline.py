"""The cluster view's timeline, replayed from job events and kept between requests.

Queue length, GPUs in use and cluster efficiency change only at job events (a
change of state or parallelism), so the timeline is a replay of them:

    queue length(t)       jobs in state ``queued``
    GPUs in use(t)        sum of parallelism of running/scaling jobs
    efficiency(t)         sum over running jobs of thr(n)/thr(1), over all GPUs
                          (EDL's cluster efficiency; a job not yet profiled
                          counts as scaling perfectly, thr(n)/thr(1) = n)
    GPUs in use(t, type)  the same sum, per GPU type a job runs on (``Job.ran_on_type``,
                          its latest start's type: a job never straddles types)

:class:`Replay` keeps the sums as it goes (each event moves one job's share), so
a replay is linear in the events.  A process keeps one replay per window and, on
the next request, applies only the events written since (:func:`timeline`).  It
replays from scratch when it has none, every ``REBUILD_SECONDS``, and when an
event turns up that belongs before what it already applied (a transaction that
committed late): those are the cases an incremental replay could get wrong.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, TextField
from django.db.models.functions import Cast

from jobs.choices import ACTIVE_STATES, JobState
from jobs.models import Job, JobEvent
from scheduler.curves import speedup

TIMELINE_POINTS = 600
"""Most points sent to the browser (evenly thinned)."""
REBUILD_SECONDS = 60.0
"""A kept replay is rebuilt from scratch at least this often (a changed curve shows then)."""
LATE_SECONDS = 5.0
"""Events are re-read this far back: one committed a little late is still applied in order."""

Event = tuple[int, int, datetime, str, int | None]
"""(event id, job id, time, new state or "", new parallelism or None)."""
UNTYPED = ""
"""The type of a job started before types were kept, or on a one-type cluster's untyped path."""
Share = tuple[int, int, float, str]
"""One job's part of the sums: (queued, GPUs in use, thr(n)/thr(1), its GPU type)."""


def _share(state: str | None, width: int, curve: Any, gpu_type: str) -> Share:
    """One job's part of the sums."""
    if state in ACTIVE_STATES:
        return 0, width, speedup(curve, width), gpu_type
    return (1 if state == JobState.QUEUED else 0), 0, 0.0, gpu_type


def typed_series(
    rows: list[dict[str, int]], total_by_type: dict[str, int]
) -> dict[str, list[float | None]]:
    """Per GPU type, the share of its GPUs in use at each point (``rows``: type -> GPUs).

    A job of no recorded type counts toward the only type of a one-type cluster; with
    several types it is left out (its GPUs still count in ``gpus_in_use``).
    """
    only = next(iter(total_by_type)) if len(total_by_type) == 1 else None
    out: dict[str, list[float | None]] = {}
    for gpu_type, total in sorted(total_by_type.items()):
        out[gpu_type] = [
            round(
                min(1.0, (row.get(gpu_type, 0) + (row.get(UNTYPED, 0) if only else 0)) / total),
                4,
            )
            if total
            else None
            for row in rows
        ]
    return out


@dataclass
class Replay:
    """The sums after the events applied so far, and one point per event."""

    curves: dict[int, Any] = field(default_factory=dict)
    types: dict[int, str] = field(default_factory=dict)
    """Each job's GPU type (``Job.ran_on_type``) as last read."""
    state: dict[int, str] = field(default_factory=dict)
    width: dict[int, int] = field(default_factory=dict)
    shares: dict[int, Share] = field(default_factory=dict)
    queued: int = 0
    used: int = 0
    eff: float = 0.0
    used_by_type: dict[str, int] = field(default_factory=dict)
    points: list[tuple[datetime, int, int, float]] = field(default_factory=list)
    typed: list[dict[str, int]] = field(default_factory=list)
    """GPUs in use per type at each of ``points`` (the same length)."""
    before: tuple[int, int, float] = (0, 0, 0.0)
    """The sums just before ``points[0]`` (what the trimmed points ended on)."""
    typed_before: dict[str, int] = field(default_factory=dict)
    last_at: datetime | None = None
    recent: dict[int, datetime] = field(default_factory=dict)
    """Applied events within ``LATE_SECONDS`` of ``last_at``, by id: re-read, not re-applied."""
    built: float = field(default_factory=time.monotonic)

    def apply(self, events: Iterable[Event]) -> bool:
        """Apply ``events`` (in time order); False if one belongs before what was applied."""
        for event_id, job_id, at, to_state, to_parallelism in events:
            if event_id in self.recent:
                continue
            if self.last_at is not None and at < self.last_at:
                return False
            if to_state:
                self.state[job_id] = to_state
            if to_parallelism is not None:
                self.width[job_id] = to_parallelism
            old = self.shares.get(job_id, (0, 0, 0.0, UNTYPED))
            new = _share(
                self.state.get(job_id),
                self.width.get(job_id, 0),
                self.curves.get(job_id),
                self.types.get(job_id, UNTYPED),
            )
            self.shares[job_id] = new
            self.queued += new[0] - old[0]
            self.used += new[1] - old[1]
            self.eff += new[2] - old[2]
            by_type = self.used_by_type
            if old[1]:
                by_type[old[3]] -= old[1]
            if new[1]:
                by_type[new[3]] = by_type.get(new[3], 0) + new[1]
            self.points.append((at, self.queued, self.used, self.eff))
            self.typed.append(dict(self.used_by_type))
            if self.last_at is None or at > self.last_at:
                self.last_at = at
            self.recent[event_id] = at
        return True

    def forget_old(self) -> None:
        """Keep in ``recent`` only the events within ``LATE_SECONDS`` of the newest."""
        if self.last_at is not None:
            horizon = self.last_at - timedelta(seconds=LATE_SECONDS)
            self.recent = {i: t for i, t in self.recent.items() if t >= horizon}

    def trim(self, since: datetime) -> None:
        """Forget the points before ``since``, remembering the sums they ended on."""
        cut = 0
        while cut < len(self.points) and self.points[cut][0] < since:
            cut += 1
        if cut:
            self.before = self.points[cut - 1][1:]
            self.typed_before = self.typed[cut - 1]
            del self.points[:cut]
            del self.typed[:cut]

    def series(
        self,
        since: datetime | None,
        now: datetime,
        total_gpus: int,
        total_by_type: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """The points in [since, now] (``since`` and ``now`` included), thinned for the page.

        ``utilization_by_type``: per GPU type of ``total_by_type`` (its GPUs now), the
        share of them in use at each point.
        """
        if since is not None:
            self.trim(since)
            rows = [(since, *self.before), *self.points]
            typed = [self.typed_before, *self.typed]
        else:
            rows, typed = list(self.points), list(self.typed)
        rows.append((now, self.queued, self.used, self.eff))
        typed.append(dict(self.used_by_type))
        if len(rows) > TIMELINE_POINTS:  # keep the payload small: even thinning
            step = len(rows) / TIMELINE_POINTS
            keep = sorted({int(i * step) for i in range(TIMELINE_POINTS)} | {len(rows) - 1})
            rows, typed = [rows[i] for i in keep], [typed[i] for i in keep]
        return {
            "t": [at.isoformat() for at, *_ in rows],
            "queue": [q for _, q, _, _ in rows],
            "gpus_in_use": [u for _, _, u, _ in rows],
            "efficiency": [
                round(max(e, 0.0) / total_gpus, 4) if total_gpus else None for *_, e in rows
            ],
            "utilization_by_type": typed_series(typed, total_by_type or {}),
        }


def _relevant(since: datetime | None) -> Any:
    jobs = Job.objects.all()
    if since is not None:
        jobs = jobs.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
    return jobs


def _events(query: Any) -> Iterable[Event]:
    return query.order_by("at", "id").values_list(  # type: ignore[no-any-return]
        "id", "job_id", "at", "to_state", "to_parallelism"
    )


def full_replay(since: datetime | None) -> Replay:
    """Replay every event of the jobs that matter to the window from ``since`` on."""
    relevant = _relevant(since)
    replay = Replay()
    for pk, curve, gpu_type in relevant.values_list("pk", "throughput_curve", "ran_on_type"):
        replay.curves[pk], replay.types[pk] = curve, gpu_type
    replay.apply(_events(JobEvent.objects.filter(job__in=relevant.values("pk"))))
    replay.forget_old()
    return replay


def extend(replay: Replay) -> bool:
    """Apply the events written since ``replay`` was last brought up to date.

    False when the replay cannot be extended: one of them belongs before what was
    applied, or the newest event it applied is gone (the database changed behind it).
    Two queries, whatever the number of events.
    """
    if replay.last_at is None:
        return False
    replay.forget_old()
    newest = max(replay.recent, key=replay.recent.__getitem__)
    if not JobEvent.objects.filter(pk=newest).exists():
        return False
    horizon = replay.last_at - timedelta(seconds=LATE_SECONDS)
    # The events already applied are skipped here, not excluded in SQL: one tick can
    # write thousands of events in the same instant, and a NOT IN of thousands of ids
    # cost more to send and plan than the rows cost to read.  A job's curve comes as
    # text and is parsed only for a job the replay has not seen.
    fresh = JobEvent.objects.filter(at__gte=horizon).order_by("at", "id")
    events: list[Event] = []
    for event_id, job_id, at, to_state, to_parallelism, curve, gpu_type in fresh.values_list(
        "id",
        "job_id",
        "at",
        "to_state",
        "to_parallelism",
        Cast("job__throughput_curve", TextField()),
        "job__ran_on_type",
    ):
        if event_id in replay.recent:
            continue
        replay.types[job_id] = gpu_type  # a start records it with its event
        if job_id not in replay.curves:
            replay.curves[job_id] = json.loads(curve) if curve else None
        events.append((event_id, job_id, at, to_state, to_parallelism))
    return replay.apply(events)


_kept: dict[str, Replay] = {}
_lock = threading.Lock()


def timeline(
    window: str,
    since: datetime | None,
    now: datetime,
    total_gpus: int,
    total_by_type: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Queue length, GPUs in use, cluster efficiency (and use per GPU type) over [since, now]."""
    with _lock:
        replay = _kept.get(window)
        stale = replay is not None and time.monotonic() - replay.built > REBUILD_SECONDS
        if replay is None or stale or not extend(replay):
            replay = full_replay(since)
            _kept[window] = replay
        return replay.series(since, now, total_gpus, total_by_type)


def forget() -> None:
    """Drop every kept replay (tests; a process that changed the database behind it)."""
    with _lock:
        _kept.clear()
