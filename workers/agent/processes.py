"""The agent's process table: the training processes it runs and the stops it enforces.

Not thread-safe on its own: the ``Agent`` calls it under its one lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from dataclasses import dataclass

from workers.agent.config import AgentConfig
from workers.agent.launch import process_matches, spawn, worker_argv, worker_env
from workers.agent.store import AgentStore, StopRecord, WorkerRecord
from workers.clock import Clock
from workers.protocol import RunningWorker, StartWorkers, WorkerSlot

log = logging.getLogger(__name__)

ChildKey = tuple[str, str]
"""(job, worker id)."""


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


@dataclass(frozen=True)
class Exit:
    """A child that has exited: its record, its exit code (None: adopted), how it was ended."""

    record: WorkerRecord
    code: int | None
    signalled: bool


def running(record: WorkerRecord) -> RunningWorker:
    """The protocol's view of a process record."""
    return RunningWorker(
        job=record.job, worker_id=record.worker_id, slot=record.slot, pid=record.pid
    )


class ProcessTable:
    """Which training process runs in which slot, and which jobs are being stopped."""

    def __init__(self, config: AgentConfig, store: AgentStore, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.children: dict[ChildKey, Child] = {}
        self.stops: dict[str, StopRecord] = {}

    # ------------------------------------------------------------------ queries
    def has(self, job: str, worker_id: str) -> bool:
        """Whether ``worker_id`` of ``job`` runs here."""
        return (job, worker_id) in self.children

    def slot_holders(self) -> dict[int, ChildKey]:
        """Busy slots and who holds them."""
        return {child.record.slot: key for key, child in self.children.items()}

    def of_job(self, job: str) -> list[Child]:
        """The processes of ``job`` on this node."""
        return [child for (j, _w), child in self.children.items() if j == job]

    def records(self) -> list[WorkerRecord]:
        """Every process record, ordered by (job, worker)."""
        return [child.record for _key, child in sorted(self.children.items())]

    def free_slots(self) -> tuple[int, ...]:
        """The slots no process holds."""
        busy = {child.record.slot for child in self.children.values()}
        return tuple(slot for slot in range(self.config.slots) if slot not in busy)

    def running_of(self, command: StartWorkers) -> tuple[RunningWorker, ...]:
        """Those workers of ``command`` that run here."""
        out = []
        for worker in command.workers:
            child = self.children.get((command.job, worker.worker_id))
            if child is not None:
                out.append(running(child.record))
        return tuple(out)

    # ------------------------------------------------------------------ changes
    def start(self, command: StartWorkers, worker: WorkerSlot) -> WorkerRecord:
        """Start one training process (raises OSError if it cannot start)."""
        log_path = self.config.log_path(command.job, worker.worker_id)
        argv = worker_argv(self.config, command, worker)
        popen = spawn(argv, worker_env(self.config), log_path)
        record = WorkerRecord(
            job=command.job,
            worker_id=worker.worker_id,
            slot=worker.slot,
            pid=popen.pid,
            log_path=str(log_path),
            started_at=self.clock.now(),
        )
        self.children[(command.job, worker.worker_id)] = Child(record=record, popen=popen)
        self.store.save_worker(record)
        log.info("started worker %s of job %s (pid %d)", worker.worker_id, command.job, popen.pid)
        return record

    def adopt(self, record: WorkerRecord) -> bool:
        """Adopt a process a previous agent started; False (and forget it) if it is gone."""
        if process_matches(record.pid, record.job, record.worker_id, self.config.worker_module):
            self.children[(record.job, record.worker_id)] = Child(record=record, popen=None)
            log.info(
                "adopted worker %s of job %s (pid %d)", record.worker_id, record.job, record.pid
            )
            return True
        self.store.drop_worker(record.job, record.worker_id)
        return False

    def stop(self, job: str, command_id: str, grace_seconds: float) -> None:
        """Remember that ``job`` stops here: its processes are signalled after the grace."""
        record = StopRecord(command_id=command_id, deadline=self.clock.now() + grace_seconds)
        self.stops[job] = record
        self.store.save_stop(job, record)

    def reap(self) -> list[Exit]:
        """Forget the processes that exited; return them."""
        exits = []
        for key, child in list(self.children.items()):
            exited, code = child.poll(self.config.worker_module)
            if not exited:
                continue
            del self.children[key]
            self.store.drop_worker(child.record.job, child.record.worker_id)
            exits.append(Exit(child.record, code, child.stop_signal_sent is not None))
        return exits

    def enforce_stops(self) -> None:
        """SIGTERM what is left of a stopping job after its grace, SIGKILL a while later."""
        now = self.clock.now()
        for job, stop in self.stops.items():
            if now < stop.deadline:
                continue
            for child in self.of_job(job):
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

    def end_all(self) -> None:
        """SIGTERM every process, SIGKILL those still there after ``stop_kill_after_seconds``."""
        children = list(self.children.values())
        for child in children:
            child.stop_signal_sent = self.clock.now()
            child.signal(signal.SIGTERM)
        deadline = self.clock.monotonic() + self.config.stop_kill_after_seconds
        while self.clock.monotonic() < deadline and any(
            not c.poll(self.config.worker_module)[0] for c in children
        ):
            self.clock.sleep(0.1)
        for child in children:
            if not child.poll(self.config.worker_module)[0]:
                child.signal(signal.SIGKILL)
                if child.popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.popen.wait(timeout=5)
