"""Forwarding the runtime events of the jobs an agent hosts, as reports.

Each hosted job has a ``JobWatch``: its ``JobControl`` and how far its event
stream was read.  The first agent to claim an event in Redis sends it, so a
job spread over several nodes reports each event once.

The stream is the tenant program's to write, so every entry is untrusted
input (``workers.job_events``)::

    entry ──▶ id not in the future ──▶ within the job's rate (EventBudget)
          ──▶ decodes (size, UTF-8, JSON object, depth, text that encodes)
          ──▶ makes a valid report (workers.protocol) that signs
          ──▶ claimed ──▶ sent
    any refusal ──▶ dropped, counted; the count goes to the portal as an
                    ``events_dropped`` report (at most one per job every
                    ``DROPPED_REPORT_EVERY_S``), which the job's history shows

Nothing an entry holds is raised out of ``forward``: a pass over the jobs
always reaches the heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.agent.reports import report_from_event
from workers.agent.store import AgentStore
from workers.clock import SYSTEM_CLOCK, Clock
from workers.elastic.control import JobControl
from workers.elastic.redis_client import DEFAULT_OUTAGE_S, connect
from workers.job_events import (
    EventBudget,
    EventRefused,
    check_entry_id,
    decode_entry,
    entry_size,
    safe_text,
)
from workers.protocol import (
    EVENTS_DROPPED_REASON_CHARS,
    EventsDropped,
    Failed,
    Finished,
    ProtocolError,
    Report,
)
from workers.signing import canonical_json

log = logging.getLogger(__name__)

READ_PER_PASS = 100
"""The most entries of one job's stream read in one pass (the rest wait for the next).

With ``MAX_EVENT_BYTES`` it bounds what one job makes the agent hold in a pass (100 MiB
at worst; Redis's own memory limit bounds what a job can write at all)."""

DROPPED_REPORT_EVERY_S = 10.0
"""How often, at most, a job's dropped entries are reported (one report counts them all)."""

FINISHED_GRACE_S = 120.0
"""How long a job's processes here may outlive its runtime's ``finished`` event.

The runtime writes the final checkpoint before ``finished`` and the processes
exit right after; the control plane frees the job's GPUs on the event.  A
program that writes ``finished`` and trains on would hold them unbilled."""

RawEntries = list[tuple[str, dict[bytes, bytes]]]
"""``[(entry id, raw fields)]`` of a job's event stream, oldest first."""


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
    def read_raw_events(self, last_id: str, count: int) -> RawEntries: ...
    def stream_end(self) -> str: ...


class AgentJobControl(JobControl):
    """The runtime's ``JobControl``, reading the events stream as bytes.

    ``JobControl.read_events`` decodes and parses every entry of a batch: one
    entry that is not UTF-8 or not JSON fails the whole read, every pass,
    and the job's events stop there.  The agent reads the raw entries and
    judges each on its own (``workers.job_events``).
    """

    def __init__(self, redis_url: str, job_id: str, outage_s: float = DEFAULT_OUTAGE_S) -> None:
        super().__init__(redis_url, job_id, outage_s=outage_s)
        self.raw = connect(redis_url, outage_s=outage_s, decode_responses=False)

    def read_raw_events(self, last_id: str, count: int) -> RawEntries:
        """Up to ``count`` entries after ``last_id``, their fields as Redis holds them."""
        answer: Any = self.raw.xread({self.keys.events: last_id}, count=count)
        out: RawEntries = []
        for _stream, entries in answer or []:
            for entry_id, fields in entries:
                out.append((_id_text(entry_id), _raw_fields(fields)))
        return out

    def stream_end(self) -> str:
        """Id of the job's latest event, so that tailing starts after it ("0" if none)."""
        last: Any = self.raw.xrevrange(self.keys.events, count=1)
        return _id_text(last[0][0]) if last else "0"


def _id_text(value: Any) -> str:
    # Redis makes entry ids ASCII ("<ms>-<seq>"); a writer-chosen one is digits too.
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _raw_fields(fields: Mapping[Any, Any]) -> dict[bytes, bytes]:
    def raw(value: Any) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    return {raw(key): raw(value) for key, value in fields.items()}


def default_control_factory(redis_url: str) -> Callable[[str], JobControlLike]:
    """JobControl of the elastic runtime, per job."""

    def make(job: str) -> JobControlLike:
        # The agent outlives a Redis restart: its reads wait for Redis like the runtime's.
        return AgentJobControl(redis_url, job, outage_s=DEFAULT_OUTAGE_S)

    return make


@dataclass
class Dropped:
    """Entries of a job's stream dropped since the last ``events_dropped`` report."""

    count: int = 0
    reason: str = ""
    first_event_id: str = ""
    last_event_id: str = ""

    def add(self, event_id: str, reason: str) -> None:
        """Count one more dropped entry (the first one's reason is kept)."""
        if not self.count:
            self.reason = safe_text(reason, EVENTS_DROPPED_REASON_CHARS)
            self.first_event_id = event_id
        self.count += 1
        self.last_event_id = event_id


@dataclass
class JobWatch:
    """Per-job bookkeeping: where the event stream was read up to."""

    cursor: str
    control: JobControlLike
    ended: bool = False
    last_crash: str | None = None
    crashed_workers: set[str] = field(default_factory=set)
    dropped: Dropped = field(default_factory=Dropped)
    next_dropped_report: float = 0.0
    clean_exits: set[str] = field(default_factory=set)
    """Workers of the job that exited 0 here."""
    launcher: str | None = None
    """How its processes here were launched (``edl``, ``torchrun``; None: a built-in)."""
    finished_at: float | None = None
    """Wall time the runtime's ``finished`` event was read (its processes should exit)."""


class EventForwarder:
    """The jobs an agent hosts, each with its event stream tailed into reports."""

    def __init__(
        self,
        node: str,
        store: AgentStore,
        control_factory: Callable[[str], JobControlLike],
        send: Callable[[Report], object],
        *,
        clock: Clock = SYSTEM_CLOCK,
        budget: EventBudget | None = None,
    ) -> None:
        self.node = node
        self.store = store
        self._control_factory = control_factory
        self._send = send
        self.clock = clock
        """Wall time judges entry ids (Redis's own clock makes them), monotonic time the rate."""
        self.budget = budget or EventBudget()
        self.finished_grace_s = FINISHED_GRACE_S
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
        """Send the job's new runtime events as reports (each event by one agent only).

        Never raises for what the stream holds: a refused entry is dropped and
        counted (``events_dropped``).
        """
        watch = self.jobs[job]
        try:
            entries = watch.control.read_raw_events(watch.cursor, READ_PER_PASS)
        except Exception:  # Redis hiccup: try again next tick
            log.exception("could not read the events of job %s", job)
            return
        for event_id, fields in entries:
            watch.cursor = event_id
            self._forward_one(job, watch, event_id, fields)
        if entries:
            self.store.save_cursor(job, watch.cursor)
        self._report_dropped(job, watch)

    def _forward_one(
        self, job: str, watch: JobWatch, event_id: str, fields: Mapping[bytes, bytes]
    ) -> None:
        try:
            report = self._vet(job, event_id, fields)
        except (EventRefused, ProtocolError) as exc:
            self._drop(job, watch, event_id, str(exc))
            return
        except Exception as exc:  # whatever an entry holds, the pass goes on
            log.exception("job %s: runtime event %s broke its translation", job, event_id)
            self._drop(job, watch, event_id, f"unreadable event ({type(exc).__name__})")
            return
        if isinstance(report, Finished | Failed):
            watch.ended = True
        if isinstance(report, Finished) and watch.finished_at is None:
            watch.finished_at = self.clock.now()
        if report is not None and self.store.claim_event(job, event_id):
            self._send_safely(report)

    def _vet(self, job: str, event_id: str, fields: Mapping[bytes, bytes]) -> Report | None:
        """The report of one entry, or ``EventRefused``/``ProtocolError`` saying why not."""
        check_entry_id(event_id, now_s=self.clock.now())
        size = entry_size(fields)
        if not self.budget.take(job, size, self.clock.monotonic()):
            raise EventRefused(
                f"over the job's rate of {self.budget.events_per_s:g} events "
                f"and {self.budget.bytes_per_s / 1024:g} KiB a second"
            )
        event = decode_entry(fields)
        report = report_from_event(self.node, job, event_id, event)
        if report is not None:
            try:  # exactly what signing does to it (workers.signing.seal)
                canonical_json(report.to_dict())
            except ValueError as exc:
                raise EventRefused(f"{event['kind']} event does not sign: {exc}") from None
        return report

    def _drop(self, job: str, watch: JobWatch, event_id: str, reason: str) -> None:
        """Count a refused entry once across the job's agents (the one that claims it).

        Logged as a warning once per report interval (a flood would flood the log too).
        """
        level = logging.DEBUG if watch.dropped.count else logging.WARNING
        log.log(level, "job %s: dropped runtime event %s: %s", job, event_id, safe_text(reason))
        try:
            if not self.store.claim_event(job, event_id):
                return
        except Exception:  # Redis away: counted here, at worst twice
            log.warning("could not claim dropped event %s of job %s", event_id, job)
        watch.dropped.add(event_id, reason)

    def _report_dropped(self, job: str, watch: JobWatch, *, now: bool = False) -> None:
        """Send the job's dropped count, at most every ``DROPPED_REPORT_EVERY_S``."""
        if not watch.dropped.count:
            return
        at = self.clock.monotonic()
        if not now and at < watch.next_dropped_report:
            return
        dropped, watch.dropped = watch.dropped, Dropped()
        watch.next_dropped_report = at + DROPPED_REPORT_EVERY_S
        self._send_safely(
            EventsDropped(
                node=self.node,
                job=job,
                count=dropped.count,
                reason=dropped.reason,
                first_event_id=dropped.first_event_id,
                last_event_id=dropped.last_event_id,
            )
        )

    def _send_safely(self, report: Report) -> None:
        try:
            self._send(report)
        except Exception:  # a report that cannot leave must not stop the pass
            log.exception("could not send a %s report", report.TYPE)

    def note_crash(self, job: str, worker_id: str, code: int | None) -> None:
        """Remember a crash here, in case nobody of the job is left to report its end."""
        watch = self.jobs.get(job)
        if watch is not None:
            watch.last_crash = f"worker {worker_id} exited with code {code}"
            watch.crashed_workers.add(worker_id)

    def note_exit(
        self, job: str, worker_id: str, outcome: str, code: int | None, launcher: str | None
    ) -> None:
        """Remember how a worker of ``job`` ended here (``lost_reason`` judges the job by it)."""
        if outcome == "crashed":
            self.note_crash(job, worker_id, code)
        watch = self.jobs.get(job)
        if watch is None:
            return
        watch.launcher = launcher
        if outcome == "clean":
            watch.clean_exits.add(worker_id)

    def lost_reason(self, watch: JobWatch) -> str | None:
        """Why the job failed, when its processes here all exited and nobody else will say it.

        An exit the agent saw is a fact, whatever the stream says: a worker
        that crashed while every member the runtime knows has exited here
        (``job_lost``), or processes that all exited 0 although the runtime
        never started (no leader ever wrote the job's state, no ``finished``):
        a program under the ``edl`` launcher that never called ``edl.run``.
        A torchrun program's exits are the control plane's to judge, and so are a
        session's (its lab shut down by its user exits 0 with no runtime at all).
        """
        if watch.ended:
            return None
        if watch.last_crash is not None and self.job_lost(watch):
            return f"every worker of the job has exited; {watch.last_crash}"
        if watch.launcher in ("torchrun", "session") or not watch.clean_exits:
            return None
        if not self._never_started(watch):
            return None
        if watch.launcher == "edl":
            return (
                "the program exited 0 without finishing under the edl launcher: "
                "did it call `edl.run`?"
            )
        return "every worker exited 0 but the runtime never started (no finished event)"

    @staticmethod
    def _never_started(watch: JobWatch) -> bool:
        """Whether no leader of the job ever wrote its state (the runtime never ran)."""
        try:
            status = watch.control.status()
        except Exception:
            log.exception("could not read a job's status")
            return False
        generation = getattr(status, "generation", 0)
        return getattr(status, "state", "") == "starting" and generation < 0

    def past_finish(self) -> list[str]:
        """The jobs whose ``finished`` event is older than ``finished_grace_s``: stop them here."""
        limit = self.clock.now() - self.finished_grace_s
        return [
            job
            for job, watch in self.jobs.items()
            if watch.finished_at is not None and watch.finished_at <= limit
        ]

    def ended(self, job: str) -> bool:
        """Whether the job's runtime reported it finished or failed."""
        watch = self.jobs.get(job)
        return watch is not None and watch.ended

    def forget(self, job: str) -> JobWatch:
        """Stop tailing ``job`` (its dropped count is reported first); return its watch."""
        watch = self.jobs.pop(job)
        self._report_dropped(job, watch, now=True)
        self.budget.forget(job)
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
    return control.stream_end()
