"""Applying the control plane's commands on one node, each once.

Trust: a command arrives in an envelope signed with this node's key
(``workers.signing``); ``receive_signed`` refuses (logs, changes nothing,
answers nothing) one that is unsigned, badly signed, meant for another node
or outside the time window.  A command's checkpoint and store locations must
lie inside the agent's storage roots (``AgentConfig.location_refusal``).

Idempotency: each command id is remembered in Redis once applied, and a
replay is answered without acting again.  The actions themselves are
idempotent too (starting a worker id that already runs does nothing), so a
command redelivered after a crash in the middle of applying it is safe.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from workers.agent.config import AgentConfig
from workers.agent.environments import Environment, EnvironmentFailed
from workers.agent.events import EventForwarder
from workers.agent.processes import ProcessTable
from workers.agent.programs import job_dirs
from workers.agent.shell import Shells
from workers.agent.store import AgentStore
from workers.clock import Clock
from workers.protocol import (
    MAX_EVICTION_DETAIL_CHARS,
    Command,
    EnvironmentEvicted,
    EvictEnvironment,
    EvictionOutcome,
    Failed,
    Migrate,
    OpenShell,
    Profile,
    ProtocolError,
    Rejected,
    Report,
    ScaleIn,
    Started,
    StartWorkers,
    StopJob,
    WorkerSlot,
)
from workers.signing import SignatureError, open_envelope

log = logging.getLogger(__name__)


class CommandRejected(Exception):
    """A command that cannot be applied here; nothing was changed."""


class SlotBusy(CommandRejected):
    """A start refused because another process holds the slot: which one, from the process table."""

    def __init__(self, slot: int, job: str, worker_id: str) -> None:
        super().__init__(f"slot {slot} is busy with worker {worker_id} of job {job}")
        self.slot = slot
        self.job = job
        self.worker_id = worker_id


class CommandHandler:
    """Parses, checks and applies commands against the process table and the watched jobs."""

    def __init__(
        self,
        config: AgentConfig,
        store: AgentStore,
        processes: ProcessTable,
        events: EventForwarder,
        send: Callable[[Report], object],
        lock: threading.RLock,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store = store
        self.processes = processes
        self.events = events
        self._send = send
        self._lock = lock
        self.clock = clock
        self._environments: dict[str, Environment] = {}
        """Environments prepared for start commands not yet applied, by command id."""
        self.shells = Shells(config, store, processes, lock, clock)

    def receive_signed(self, envelope: Any) -> str:
        """Check a command's envelope, then ``receive`` its body; ``refused`` if it is forged.

        A refused envelope is logged with the reason and answered with no
        report: whoever forged it learns nothing, and the control plane never
        sent it.
        """
        try:
            signed = open_envelope(
                envelope,
                key_for=lambda node: self.config.key or None,
                now=self.clock.now(),
                expected_node=self.config.node,
                max_age_s=self.config.message_max_age_s,
                max_skew_s=self.config.message_max_skew_s,
            )
        except SignatureError as exc:
            log.warning("refused a command: %s", exc)
            return "refused"
        return self.receive(signed.body)

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
            self._send(
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
        if isinstance(command, EvictEnvironment):
            return self._evict_environment(command)
        if isinstance(command, OpenShell):  # answered on the shell's own stream
            return self.shells.open(command)
        starting = command.joining if isinstance(command, Migrate) else command
        if isinstance(starting, StartWorkers):
            self._wait_for_slots(starting)
            try:
                self._prepare_environment(command.command_id, starting)
            except EnvironmentFailed as failed:
                return self._environment_failed(command, failed)
        with self._lock:
            if self.store.was_applied(command.command_id):
                log.info("command %s replayed: no-op", command.command_id)
                self._answer_replay(command)
                return "replayed"
            try:
                self._dispatch(command)
            except CommandRejected as exc:
                self._environments.pop(command.command_id, None)
                log.warning("rejected %s %s: %s", command.TYPE, command.command_id, exc)
                busy = exc if isinstance(exc, SlotBusy) else None
                self._send(
                    Rejected(
                        node=self.config.node,
                        error=str(exc),
                        command_id=command.command_id,
                        job=command.job,
                        command_type=command.TYPE,
                        busy_slot=busy.slot if busy else None,
                        busy_job=busy.job if busy else None,
                        busy_worker=busy.worker_id if busy else None,
                    )
                )
                return "rejected"
            self.store.mark_applied(command.command_id)
            log.info("applied %s %s for job %s", command.TYPE, command.command_id, command.job)
            return "applied"

    def environments_in_use(self) -> dict[str, list[str]]:
        """The environment keys this node's workers run in, or a start here is about to,
        each with who (``job/worker``, or ``a start of job J``).  Under the lock."""
        users: dict[str, list[str]] = {}
        for record in self.processes.records():
            if record.environment is not None:
                users.setdefault(record.environment, []).append(record.key)
        for prepared in self._environments.values():  # built for a start not yet applied
            users.setdefault(prepared.key, []).append("a start under way")
        return users

    def _evict_environment(self, command: EvictEnvironment) -> str:
        """An admin's eviction: refused for a key in use here, else ``EnvironmentCache.remove``;
        answered with ``EnvironmentEvicted`` either way, once per command id.

        The removal runs outside the lock, as the LRU's does (``Agent.clean``):
        it waits for a build of the same key to end, and supervision must not
        wait with it.
        """
        key = command.key
        with self._lock:
            if self.store.was_applied(command.command_id):
                log.info("command %s replayed: no-op", command.command_id)
                return "replayed"
            users = self.environments_in_use().get(key, [])
        outcome: EvictionOutcome
        if users:
            outcome, detail = "in_use", f"in use on {self.config.node} by {', '.join(users)}"
        else:
            try:
                found = self.processes.environments.remove(key)
            except OSError as exc:
                outcome, detail = "failed", f"could not remove it: {exc.strerror or exc}"
            else:
                outcome, detail = ("evicted", "") if found else ("not_found", "")
        with self._lock:
            self.store.mark_applied(command.command_id)
        log.info("evict_environment %s of %s: %s %s", command.command_id, key, outcome, detail)
        self._send(
            EnvironmentEvicted(
                node=self.config.node,
                command_id=command.command_id,
                key=key,
                outcome=outcome,
                detail=detail[:MAX_EVICTION_DETAIL_CHARS],
            )
        )
        return "applied" if outcome == "evicted" else "rejected"

    def _prepare_environment(self, command_id: str, command: StartWorkers) -> None:
        """Build the program's environment before the lock (a build takes seconds to
        minutes; supervision and heartbeats go on meanwhile), its output into the first
        worker's log.  Nothing for a built-in, a replay, or code that cannot be had (the
        start reports that)."""
        program = command.program
        if program is None or not command.workers or self.store.was_applied(command_id):
            return
        try:
            code_dir = self.processes.resolve_code(program)
        except (OSError, ValueError, RuntimeError):
            return
        log_path = self.config.log_path(command.job, command.workers[0].worker_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as out:
            environment = self.processes.environment(command.job, program, code_dir, out)
        if environment is not None:
            self._environments[command_id] = environment

    def _environment_failed(self, command: Command, failed: EnvironmentFailed) -> str:
        """The job's environment does not build: it fails, with no retry (the same request
        fails again); the command counts as applied, so a replay does not build again."""
        log.warning("job %s: its environment does not build: %s", command.job, failed.reason)
        with self._lock:
            self.store.mark_applied(command.command_id)
        known = " (as before: not built again)" if failed.known else ""
        self._send(
            Failed(
                node=self.config.node,
                job=command.job,
                error=f"its environment does not build{known}: {failed.reason}",
                final=True,
            )
        )
        return "failed"

    def _dispatch(self, command: Command) -> None:
        if isinstance(command, StartWorkers):
            self._start_workers(command)
        elif isinstance(command, ScaleIn):
            control = self.events.watch(command.job).control
            if command.rank_order:  # before the request: its generation follows the new plan
                control.set_rank_order(list(command.rank_order))
            control.request_scale_in(list(command.worker_ids), command.reason)
        elif isinstance(command, Migrate):
            self._migrate(command)
        elif isinstance(command, StopJob):
            self.events.watch(command.job).control.request_stop(
                command.reason or "stopped by the control plane"
            )
            self.processes.stop(command.job, command.command_id, command.grace_seconds)
            self.processes.enforce_stops()  # a torchrun program's SIGTERM goes out now
        elif isinstance(command, Profile):
            self._profile(command)
        else:  # pragma: no cover - the registry has no other type
            raise CommandRejected(f"unsupported command {command.TYPE}")

    def _wait_for_slots(self, command: StartWorkers) -> None:
        """Give workers that are leaving these slots time to exit before starting others.

        The control plane hands a GPU to a new worker as soon as its previous
        worker is told to leave (scale-in, migration, stop); that worker may
        still be finishing its last mini-batch.  Waiting here (the supervisor
        thread reaps it meanwhile) turns that race into a short delay; a slot
        still busy after ``slot_wait_seconds`` is rejected as before.  A
        program's next generation (a torchrun resize is stop-resume) waits
        likewise for the job's stop on this node to complete, and for its own
        worker ids of an older generation to exit.
        """
        deadline = self.clock.monotonic() + self.config.slot_wait_seconds
        while True:
            with self._lock:
                blocked = self._blocked(command)
            if not blocked or self.clock.monotonic() >= deadline:
                return
            self.clock.sleep(0.2)

    def _blocked(self, command: StartWorkers) -> bool:
        generation = command.program.generation if command.program is not None else None
        if generation is not None and command.job in self.processes.stops:
            return True
        used = self.processes.slot_holders()
        for w in command.workers:
            if self.processes.has(command.job, w.worker_id):
                if self.processes.older(command.job, w.worker_id, generation):
                    return True
                continue
            if w.slot in used:
                return True
        return False

    def _answer_replay(self, command: Command) -> None:
        # The first answer may have been lost: confirm what runs, start nothing.
        if isinstance(command, StartWorkers | Migrate):
            start = command if isinstance(command, StartWorkers) else command.joining
            running = self.processes.running_of(start)
            if running:
                self._send(
                    Started(
                        node=self.config.node,
                        job=command.job,
                        command_id=command.command_id,
                        workers=running,
                    )
                )

    def _check_startable(self, command: StartWorkers) -> list[WorkerSlot]:
        """The workers of ``command`` still to start; raise if any cannot start here."""
        if command.job in self.processes.stops:
            raise CommandRejected(f"job {command.job} is stopping on node {self.config.node}")
        self._check_locations(command)
        if command.program is not None:
            refused = self.processes.sandbox_refusal()
            if refused is not None:
                raise CommandRejected(refused)
        generation = command.program.generation if command.program is not None else None
        to_start = []
        used = self.processes.slot_holders()
        for worker in command.workers:
            if self.processes.older(command.job, worker.worker_id, generation):
                raise CommandRejected(
                    f"worker {worker.worker_id} of job {command.job} still runs "
                    f"from an older generation on node {self.config.node}"
                )
            if self.processes.has(command.job, worker.worker_id):
                continue  # already runs: starting it again is a no-op
            if worker.slot >= self.config.slots:
                raise CommandRejected(
                    f"slot {worker.slot} does not exist on node {self.config.node} "
                    f"({self.config.slots} slots)"
                )
            holder = used.get(worker.slot)
            if holder is not None:
                raise SlotBusy(worker.slot, holder[0], holder[1])
            to_start.append(worker)
        return to_start

    def _check_locations(self, command: StartWorkers) -> None:
        """Refuse a command whose checkpoints or files would land outside the storage roots."""
        if command.program is not None:
            locations = [str(job_dirs(self.config, command).root)]
            if command.store_prefix is not None:  # what its store door will serve
                locations.append(self.config.job_store_url(command.job, command.store_prefix, None))
        else:
            locations = [
                self.config.job_store_url(command.job, command.store_prefix, command.checkpoint_dir)
            ]
        if command.checkpoint_dir is not None:
            locations.append(command.checkpoint_dir)
        for location in locations:
            refusal = self.config.location_refusal(location)
            if refusal is not None:
                raise CommandRejected(refusal)

    def _start_workers(self, command: StartWorkers, *, announce: bool = True) -> None:
        to_start = self._check_startable(command)
        watch = self.events.watch(command.job)
        if announce and command.join and command.rank_order and to_start:
            # Before the newcomers start: the leader orders their generation by it.
            watch.control.set_rank_order(list(command.rank_order))
        if announce and command.join and len(to_start) > 1:
            # Newcomers that arrive together share one communicator switch.
            watch.control.announce_joiners([w.worker_id for w in to_start])
        prepared = self._environments.get(command.command_id)  # made ready before the lock
        for worker in to_start:
            try:
                self.processes.start(command, worker, prepared)
            except (OSError, ValueError, RuntimeError) as exc:
                # RuntimeError: ProgramUnavailable, or the code cache's own errors.
                self._send(
                    Failed(
                        node=self.config.node,
                        job=command.job,
                        error=f"could not start worker {worker.worker_id}: {exc}",
                    )
                )
        environment = self._environments.pop(command.command_id, None)
        self._send(
            Started(
                node=self.config.node,
                job=command.job,
                command_id=command.command_id,
                workers=self.processes.running_of(command),
                environment=environment.used() if environment is not None else None,
            )
        )

    def _migrate(self, command: Migrate) -> None:
        self._check_startable(command.joining)  # refuse before asking the job anything
        watch = self.events.watch(command.job)
        joiners = command.joiners if command.joiners is not None else len(command.joining.workers)
        if command.rank_order:
            watch.control.set_rank_order(list(command.rank_order))
        watch.control.request_migration(list(command.leaving), command.reason, joiners=joiners)
        self._start_workers(
            dataclasses.replace(command.joining, command_id=command.command_id), announce=False
        )

    def _profile(self, command: Profile) -> None:
        watch = self.events.watch(command.job)
        try:
            watch.control.request_profile(
                command.min_workers, command.max_workers, command.batches_per_level
            )
        except ValueError as exc:
            raise CommandRejected(str(exc)) from None
