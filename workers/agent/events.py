"""Forwarding the runtime events of the jobs an agent hosts, as reports.

Each hosted job has a ``JobWatch``: its ``JobControl`` and how far its event
stream was read.  The first agent to claim an event in Redis sends it, so a
job spread over several nodes reports each event once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.agent.reports import report_from_event
from workers.agent.store import AgentStore
from workers.elastic.control import JobControl
from workers.elastic.redis_client import DEFAULT_OUTAGE_S
from workers.protocol import Failed, Finished, ProtocolError, Report

log = logging.getLogger(__name__)


class JobControlLike(Protocol):
    """What the agent uses of ``workers.elastic.control.JobControl``."""

    def request_scale_in(self, worker_ids: list[str], reason: str) -> None: ...
    def request_stop(self, reason: str) -> None: ...
    def request_migration(
        self, leaving: list[str], reason: str, joiners: int | None = None
    ) -> None: ...
    def set_rank_order(self, worker_ids: list[str]) -> None: ...
    def announce_joiners(self, worker_ids: list[str]) -> None: ...
    def request_profile(
        self, min_workers: int, max_workers: int, batches_per_level: int = 20
    ) -> None: ...
    def status(self) -> Any: ...
    def read_events(
        self, last_id: str = "0", block_ms: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]: ...


def default_control_factory(redis_url: str) -> Callable[[str], JobControlLike]:
    """JobControl of the elastic runtime, per job."""

    def make(job: str) -> JobControlLike:
        # The agent outlives a Redis restart: its reads wait for Redis like the runtime's.
        return JobControl(redis_url, job, outage_s=DEFAULT_OUTAGE_S)

    return make


@dataclass
class JobWatch:
    """Per-job bookkeeping: where the event stream was read up to."""

    cursor: str
    control: JobControlLike
    ended: bool = False
    last_crash: str | None = None
    crashed_workers: set[str] = field(default_factory=set)


class EventForwarder:
    """The jobs an agent hosts, each with its event stream tailed into reports."""

    def __init__(
        self,
        node: str,
        store: AgentStore,
        control_factory: Callable[[str], JobControlLike],
        send: Callable[[Report], object],
    ) -> None:
        self.node = node
        self.store = store
        self._control_factory = control_factory
        self._send = send
        self.jobs: dict[str, JobWatch] = {}

    def watch(self, job: str) -> JobWatch:
        """Start tailing a job's events (from now on, unless a cursor was saved)."""
        watch = self.jobs.get(job)
        if watch is None:
            control = self._control_factory(job)
            cursor = self.store.cursors().get(job) or _stream_end(control)
            watch = JobWatch(cursor=cursor, control=control)
            self.jobs[job] = watch
            self.store.save_cursor(job, cursor)
        return watch

    def forward(self, job: str) -> None:
        """Send the job's new runtime events as reports (each event by one agent only)."""
        watch = self.jobs[job]
        try:
            events = watch.control.read_events(watch.cursor)
        except Exception:  # Redis hiccup: try again next tick
            log.exception("could not read the events of job %s", job)
            return
        for event_id, event in events:
            watch.cursor = event_id
            try:
                report = report_from_event(self.node, job, event_id, event)
            except ProtocolError as exc:
                log.warning("job %s: skipped runtime event %s: %s", job, event_id, exc)
                continue
            if isinstance(report, Finished | Failed):
                watch.ended = True
            if report is not None and self.store.claim_event(job, event_id):
                self._send(report)
        if events:
            self.store.save_cursor(job, watch.cursor)

    def note_crash(self, job: str, worker_id: str, code: int | None) -> None:
        """Remember a crash here, in case nobody of the job is left to report its end."""
        watch = self.jobs.get(job)
        if watch is not None:
            watch.last_crash = f"worker {worker_id} exited with code {code}"
            watch.crashed_workers.add(worker_id)

    def ended(self, job: str) -> bool:
        """Whether the job's runtime reported it finished or failed."""
        watch = self.jobs.get(job)
        return watch is not None and watch.ended

    def forget(self, job: str) -> JobWatch:
        """Stop tailing ``job``; return its watch."""
        watch = self.jobs.pop(job)
        self.store.drop_cursor(job)
        return watch

    @staticmethod
    def job_lost(watch: JobWatch) -> bool:
        """Whether the runtime can no longer report the job's end itself.

        True when the job neither finished nor failed and every member the
        runtime last knew of is a worker that crashed here.
        """
        try:
            status = watch.control.status()
        except Exception:
            log.exception("could not read a job's status")
            return False
        if getattr(status, "state", "") in ("finished", "failed"):
            return False
        members = set(getattr(status, "members", ()) or ())
        return members <= watch.crashed_workers


def _stream_end(control: JobControlLike) -> str:
    """Id of the job's latest runtime event, so that tailing starts after it ("0" if none)."""
    client = getattr(control, "redis", None)
    keys = getattr(control, "keys", None)
    if client is None or keys is None:
        return "0"
    last = client.xrevrange(keys.events, count=1)
    return str(last[0][0]) if last else "0"
