"""The agent's core: apply commands, supervise training processes, forward events.

One ``Agent`` lives in the agent's process.  Celery's thread pool calls
``receive()`` for every command message; a supervisor thread calls ``tick()``
a few times a second.  Both share the state under one lock.

Idempotency: each command id is remembered in Redis once applied, and a
replay is answered without acting again.  The actions themselves are
idempotent too (starting a worker id that already runs does nothing), so a
command redelivered after a crash in the middle of applying it is safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.agent.config import AgentConfig
from workers.agent.launch import log_tail, process_matches, spawn, worker_argv, worker_env
from workers.agent.reports import report_from_event
from workers.agent.store import AgentStore, StopRecord, WorkerRecord
from workers.protocol import (
    Command,
    ExitOutcome,
    Failed,
    Finished,
    Heartbeat,
    Migrate,
    Profile,
    ProtocolError,
    Rejected,
    Report,
    RunningWorker,
    ScaleIn,
    Started,
    StartWorkers,
    StopJob,
    Stopped,
    WorkerExited,
    WorkerSlot,
)

log = logging.getLogger(__name__)


class JobControlLike(Protocol):
    """What the agent uses of ``workers.elastic.control.JobControl``."""

    def request_scale_in(self, worker_ids: list[str], reason: str) -> None: ...
    def request_stop(self, reason: str) -> None: ...
    def request_migration(
        self, leaving: list[str], reason: str, joiners: int | None = None
    ) -> None: ...
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
        from workers.elastic.control import JobControl

        return JobControl(redis_url, job)

    return make


class CommandRejected(Exception):
    """A command that cannot be applied here; nothing was changed."""


@dataclass
class Child:
    """A training process: started by this agent (``popen``) or adopted after a restart."""

    record: WorkerRecord
    popen: subprocess.Popen[bytes] | None
    stop_signal_sent: float | None = None

    def poll(self, module: str) -> tuple[bool, int | None]:
        """(exited, exit code); the code is None for an adopted process."""
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code
        alive = process_matches(self.record.pid, self.record.job, self.record.worker_id, module)
        return not alive, None

    def signal(self, signum: int) -> None:
        """Signal the process's whole group (the worker and anything it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.record.pid, signum)


@dataclass
class JobWatch:
    """Per-job bookkeeping: where the event stream was read up to."""

    cursor: str
    control: JobControlLike
    ended: bool = False
    last_crash: str | None = None
    crashed_workers: set[str] = field(default_factory=set)


class Agent:
    """A node agent's state and behaviour (transport-free: reports go to ``send``)."""

    def __init__(
        self,
        config: AgentConfig,
        store: AgentStore,
        send: Callable[[Report], object],
        control_factory: Callable[[str], JobControlLike] | None = None,
        *,
        send_heartbeat: Callable[[Heartbeat], object] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self._send = send
        self._send_heartbeat = send_heartbeat or send
        self._control_factory = control_factory or default_control_factory(config.redis_url)
        self._lock = threading.RLock()
        self._children: dict[tuple[str, str], Child] = {}
        self._jobs: dict[str, JobWatch] = {}
        self._stops: dict[str, StopRecord] = {}
        self._next_heartbeat = 0.0
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ commands
    def receive(self, payload: Any) -> str:
        """Parse and apply one command message; the answer says what happened.

        ``applied``, ``replayed`` (seen before: nothing done) or ``rejected``
        (bad message or impossible here: nothing changed, a ``rejected``
        report says why).
        """
        try:
            command = Command.from_dict(payload)
        except ProtocolError as exc:
            log.warning("rejected a malformed command: %s", exc)
            command_id = payload.get("command_id") if isinstance(payload, dict) else None
            job = payload.get("job") if isinstance(payload, dict) else None
            self._report(
                Rejected(
                    node=self.config.node,
                    error=str(exc),
                    command_id=command_id if isinstance(command_id, str) else None,
                    job=job if isinstance(job, str) else None,
                )
            )
            return "rejected"
        return self.apply(command)

    def apply(self, command: Command) -> str:
        """Apply a parsed command once (see ``receive``)."""
        starting = command.joining if isinstance(command, Migrate) else command
        if isinstance(starting, StartWorkers):
            self._wait_for_slots(starting)
        with self._lock:
            if self.store.was_applied(command.command_id):
                log.info("command %s replayed: no-op", command.command_id)
                self._answer_replay(command)
                return "replayed"
            try:
                if isinstance(command, StartWorkers):
                    self._start_workers(command)
                elif isinstance(command, ScaleIn):
                    self._watch(command.job).control.request_scale_in(
                        list(command.worker_ids), command.reason
                    )
                elif isinstance(command, Migrate):
                    self._migrate(command)
                elif isinstance(command, StopJob):
                    self._stop_job(command)
                elif isinstance(command, Profile):
                    self._profile(command)
                else:  # pragma: no cover - the registry has no other type
                    raise CommandRejected(f"unsupported command {command.TYPE}")
            except CommandRejected as exc:
                log.warning("rejected %s %s: %s", command.TYPE, command.command_id, exc)
                self._report(
                    Rejected(
                        node=self.config.node,
                        error=str(exc),
                        command_id=command.command_id,
                        job=command.job,
                    )
                )
                return "rejected"
            self.store.mark_applied(command.command_id)
            log.info("applied %s %s for job %s", command.TYPE, command.command_id, command.job)
            return "applied"

    def _wait_for_slots(self, command: StartWorkers) -> None:
        """Give workers that are leaving these slots time to exit before starting others.

        The control plane hands a GPU to a new worker as soon as its previous
        worker is told to leave (scale-in, migration, stop); that worker may
        still be finishing its last mini-batch.  Waiting here (the supervisor
        thread reaps it meanwhile) turns that race into a short delay; a slot
        still busy after ``slot_wait_seconds`` is rejected as before.
        """
        deadline = time.monotonic() + self.config.slot_wait_seconds
        while True:
            with self._lock:
                used = {child.record.slot for child in self._children.values()}
                busy = [
                    w
                    for w in command.workers
                    if (command.job, w.worker_id) not in self._children and w.slot in used
                ]
            if not busy or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def _answer_replay(self, command: Command) -> None:
        # The first answer may have been lost: confirm what runs, start nothing.
        if isinstance(command, StartWorkers | Migrate):
            start = command if isinstance(command, StartWorkers) else command.joining
            running = self._running_of(start)
            if running:
                self._report(
                    Started(
                        node=self.config.node,
                        job=command.job,
                        command_id=command.command_id,
                        workers=running,
                    )
                )

    def _running_of(self, command: StartWorkers) -> tuple[RunningWorker, ...]:
        out = []
        for worker in command.workers:
            child = self._children.get((command.job, worker.worker_id))
            if child is not None:
                out.append(_running(child.record))
        return tuple(out)

    def _watch(self, job: str) -> JobWatch:
        """Start tailing a job's events (from now on, unless a cursor was saved)."""
        watch = self._jobs.get(job)
        if watch is None:
            control = self._control_factory(job)
            cursor = self.store.cursors().get(job) or _stream_end(control)
            watch = JobWatch(cursor=cursor, control=control)
            self._jobs[job] = watch
            self.store.save_cursor(job, cursor)
        return watch

    def _check_startable(self, command: StartWorkers) -> list[WorkerSlot]:
        """The workers of ``command`` still to start; raise if any cannot start here."""
        if command.job in self._stops:
            raise CommandRejected(f"job {command.job} is stopping on node {self.config.node}")
        to_start = []
        used = {child.record.slot: key for key, child in self._children.items()}
        for worker in command.workers:
            if (command.job, worker.worker_id) in self._children:
                continue  # already runs: starting it again is a no-op
            if worker.slot >= self.config.slots:
                raise CommandRejected(
                    f"slot {worker.slot} does not exist on node {self.config.node} "
                    f"({self.config.slots} slots)"
                )
            holder = used.get(worker.slot)
            if holder is not None:
                raise CommandRejected(
                    f"slot {worker.slot} is busy with worker {holder[1]} of job {holder[0]}"
                )
            to_start.append(worker)
        return to_start

    def _start_workers(self, command: StartWorkers, *, announce: bool = True) -> None:
        to_start = self._check_startable(command)
        watch = self._watch(command.job)
        if announce and command.join and len(to_start) > 1:
            # Newcomers that arrive together share one communicator switch.
            watch.control.announce_joiners([w.worker_id for w in to_start])
        env = worker_env(self.config)
        started = []
        for worker in to_start:
            log_path = self.config.log_path(command.job, worker.worker_id)
            argv = worker_argv(self.config, command, worker)
            try:
                popen = spawn(argv, env, log_path)
            except OSError as exc:
                self._report(
                    Failed(
                        node=self.config.node,
                        job=command.job,
                        error=f"could not start worker {worker.worker_id}: {exc}",
                    )
                )
                continue
            record = WorkerRecord(
                job=command.job,
                worker_id=worker.worker_id,
                slot=worker.slot,
                pid=popen.pid,
                log_path=str(log_path),
                started_at=time.time(),
            )
            self._children[(command.job, worker.worker_id)] = Child(record=record, popen=popen)
            self.store.save_worker(record)
            started.append(_running(record))
            log.info(
                "started worker %s of job %s (pid %d)", worker.worker_id, command.job, popen.pid
            )
        self._report(
            Started(
                node=self.config.node,
                job=command.job,
                command_id=command.command_id,
                workers=self._running_of(command),
            )
        )

    def _migrate(self, command: Migrate) -> None:
        self._check_startable(command.joining)  # refuse before asking the job anything
        watch = self._watch(command.job)
        joiners = command.joiners if command.joiners is not None else len(command.joining.workers)
        watch.control.request_migration(list(command.leaving), command.reason, joiners=joiners)
        self._start_workers(
            dataclasses.replace(command.joining, command_id=command.command_id), announce=False
        )

    def _stop_job(self, command: StopJob) -> None:
        watch = self._watch(command.job)
        watch.control.request_stop(command.reason or "stopped by the control plane")
        record = StopRecord(
            command_id=command.command_id, deadline=time.time() + command.grace_seconds
        )
        self._stops[command.job] = record
        self.store.save_stop(command.job, record)

    def _profile(self, command: Profile) -> None:
        watch = self._watch(command.job)
        try:
            watch.control.request_profile(
                command.min_workers, command.max_workers, command.batches_per_level
            )
        except ValueError as exc:
            raise CommandRejected(str(exc)) from None

    # ------------------------------------------------------------------ supervision
    def restore(self) -> None:
        """Take over what a previous agent process of this node left in Redis.

        Processes still alive are adopted; those gone are reported as lost.
        """
        with self._lock:
            for record in self.store.workers():
                key = (record.job, record.worker_id)
                if key in self._children:
                    continue
                if process_matches(
                    record.pid, record.job, record.worker_id, self.config.worker_module
                ):
                    self._children[key] = Child(record=record, popen=None)
                    self._watch(record.job)
                    log.info(
                        "adopted worker %s of job %s (pid %d)",
                        record.worker_id,
                        record.job,
                        record.pid,
                    )
                else:
                    self.store.drop_worker(record.job, record.worker_id)
                    self._watch(record.job)
                    self._report_exit(record, None, "lost")
            for job, stop in self.store.stops().items():
                self._stops[job] = stop
                self._watch(job)

    def tick(self) -> None:
        """One supervision pass: reap processes, enforce stops, forward events, heartbeat."""
        with self._lock:
            self._reap()
            self._enforce_stops()
            for job in list(self._jobs):
                self._forward_events(job)
            self._settle_jobs()
        if time.monotonic() >= self._next_heartbeat:
            self._next_heartbeat = time.monotonic() + self.config.heartbeat_seconds
            self.heartbeat()

    def heartbeat(self) -> None:
        """Send a heartbeat now."""
        with self._lock:
            workers = tuple(
                _running(child.record) for _key, child in sorted(self._children.items())
            )
            busy = {child.record.slot for child in self._children.values()}
        free = tuple(slot for slot in range(self.config.slots) if slot not in busy)
        self._send_heartbeat(
            Heartbeat(
                node=self.config.node,
                device=self.config.device,
                slots=self.config.slots,
                free_slots=free,
                workers=workers,
            )
        )

    def _reap(self) -> None:
        for key, child in list(self._children.items()):
            exited, code = child.poll(self.config.worker_module)
            if not exited:
                continue
            del self._children[key]
            self.store.drop_worker(child.record.job, child.record.worker_id)
            outcome: ExitOutcome
            watch = self._jobs.get(child.record.job)
            if child.stop_signal_sent is not None:
                outcome = "stopped"
            elif code is None:
                # Adopted after a restart: the exit status is not ours to see.
                if child.record.job in self._stops:
                    outcome = "stopped"
                elif watch is not None and watch.ended:
                    outcome = "clean"
                else:
                    outcome = "lost"
            elif code == 0:
                outcome = "clean"
            else:
                outcome = "crashed"
            self._report_exit(child.record, code, outcome)

    def _report_exit(self, record: WorkerRecord, code: int | None, outcome: ExitOutcome) -> None:
        tail = log_tail(record.log_path) if outcome in ("crashed", "lost") else ""
        log.log(
            logging.WARNING if outcome == "crashed" else logging.INFO,
            "worker %s of job %s exited: %s (code %s)",
            record.worker_id,
            record.job,
            outcome,
            code,
        )
        if outcome == "crashed":
            watch = self._jobs.get(record.job)
            if watch is not None:
                watch.last_crash = f"worker {record.worker_id} exited with code {code}"
                watch.crashed_workers.add(record.worker_id)
        self._report(
            WorkerExited(
                node=self.config.node,
                job=record.job,
                worker_id=record.worker_id,
                slot=record.slot,
                exit_code=code,
                outcome=outcome,
                log_tail=tail,
            )
        )

    def _enforce_stops(self) -> None:
        now = time.time()
        for job, stop in self._stops.items():
            if now < stop.deadline:
                continue
            for child in self._children_of(job):
                if child.stop_signal_sent is None:
                    log.info(
                        "stop deadline passed: SIGTERM to worker %s of job %s",
                        child.record.worker_id,
                        job,
                    )
                    child.stop_signal_sent = now
                    child.signal(signal.SIGTERM)
                elif now - child.stop_signal_sent > self.config.stop_kill_after_seconds:
                    child.signal(signal.SIGKILL)

    def _forward_events(self, job: str) -> None:
        watch = self._jobs[job]
        try:
            events = watch.control.read_events(watch.cursor)
        except Exception:  # Redis hiccup: try again next tick
            log.exception("could not read the events of job %s", job)
            return
        for event_id, event in events:
            watch.cursor = event_id
            try:
                report = report_from_event(self.config.node, job, event_id, event)
            except ProtocolError as exc:
                log.warning("job %s: skipped runtime event %s: %s", job, event_id, exc)
                continue
            if isinstance(report, Finished | Failed):
                watch.ended = True
            if report is not None and self.store.claim_event(job, event_id):
                self._report(report)
        if events:
            self.store.save_cursor(job, watch.cursor)

    def _settle_jobs(self) -> None:
        """Forget jobs with nothing left here; report stops and local total failures."""
        for job in list(self._jobs):
            if self._children_of(job):
                continue
            watch = self._jobs.pop(job)
            stop = self._stops.pop(job, None)
            if stop is not None:
                self.store.drop_stop(job)
                self._report(Stopped(node=self.config.node, job=job, command_id=stop.command_id))
            elif watch.last_crash is not None and self._job_lost(watch):
                self._report(
                    Failed(
                        node=self.config.node,
                        job=job,
                        error=f"every worker of the job has exited; {watch.last_crash}",
                    )
                )
            self.store.drop_cursor(job)

    def _job_lost(self, watch: JobWatch) -> bool:
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

    def _children_of(self, job: str) -> list[Child]:
        return [child for (j, _w), child in self._children.items() if j == job]

    def _report(self, report: Report) -> None:
        self._send(report)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the supervisor thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._run, name="agent-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.tick()
            except Exception:  # the supervisor must outlive any one bad pass
                log.exception("supervisor pass failed")
            self._stop_event.wait(self.config.poll_seconds)

    def close(self, *, stop_children: bool | None = None) -> None:
        """Stop supervising; end the training processes too if so configured.

        By default the processes keep training: a restarted agent adopts them.
        """
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if stop_children is None:
            stop_children = self.config.stop_children_on_exit
        if not stop_children:
            return
        with self._lock:
            children = list(self._children.values())
            for child in children:
                child.stop_signal_sent = time.time()
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + self.config.stop_kill_after_seconds
            while time.monotonic() < deadline and any(
                not c.poll(self.config.worker_module)[0] for c in children
            ):
                time.sleep(0.1)
            for child in children:
                if not child.poll(self.config.worker_module)[0]:
                    child.signal(signal.SIGKILL)
                    if child.popen is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.popen.wait(timeout=5)
            self._reap()

    def running(self) -> list[WorkerRecord]:
        """The processes this agent runs now."""
        with self._lock:
            return [child.record for child in self._children.values()]


def _running(record: WorkerRecord) -> RunningWorker:
    return RunningWorker(
        job=record.job, worker_id=record.worker_id, slot=record.slot, pid=record.pid
    )


def _stream_end(control: JobControlLike) -> str:
    """Id of the job's latest runtime event, so that tailing starts after it ("0" if none)."""
    client = getattr(control, "redis", None)
    keys = getattr(control, "keys", None)
    if client is None or keys is None:
        return "0"
    last = client.xrevrange(keys.events, count=1)
    return str(last[0][0]) if last else "0"
