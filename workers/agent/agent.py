"""The agent's core: one object that owns a node's training processes.

::

    Agent ──┬── CommandHandler   commands in: parse, check, apply once   (commands.py)
            ├── ProcessTable     children and stops: start, adopt, reap  (processes.py)
            └── EventForwarder   runtime events out, as reports          (events.py)

One ``Agent`` lives in the agent's process.  Celery's thread pool calls
``receive()`` for every command message; a supervisor thread calls ``tick()``
a few times a second.  Both share the state under one lock.  Time comes from
an injected ``Clock``, so tests drive heartbeats and stop deadlines by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.agent import cleanup
from workers.agent.cache_report import REPORT_EVERY_S as CACHE_REPORT_EVERY_S
from workers.agent.cache_report import cache_report
from workers.agent.collect import collect
from workers.agent.collect import reports as collect_reports
from workers.agent.commands import CommandHandler
from workers.agent.commands import CommandRejected as CommandRejected  # re-exported
from workers.agent.config import SHM_ROOT, AgentConfig
from workers.agent.events import EventForwarder, JobControlLike, default_control_factory
from workers.agent.hardware import probe_for
from workers.agent.lab import HomeSyncs, LabHome, LabHomes, Labs, is_lab
from workers.agent.launch import log_tail
from workers.agent.log_shipper import LogOffsets, LogShipper, WorkerLike
from workers.agent.metrics_tail import MetricsFileTail
from workers.agent.processes import Exit, ProcessTable, ResolveCode, no_code_cache, running
from workers.agent.programs import JobDirs
from workers.agent.quota import measure, verdict
from workers.agent.redis_acl import delete_job_user, node_of_url, restore_job_user
from workers.agent.redis_guard import guard
from workers.agent.store import AgentStore, WorkerRecord
from workers.artifacts import ArtifactStore
from workers.clock import SYSTEM_CLOCK, Clock
from workers.protocol import (
    Command,
    EnvironmentCacheReport,
    ExitOutcome,
    Failed,
    Heartbeat,
    Report,
    Stopped,
    WorkerExited,
)

log = logging.getLogger(__name__)


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
        clock: Clock = SYSTEM_CLOCK,
        resolve_code: ResolveCode = no_code_cache,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self._send = send
        self._send_heartbeat = send_heartbeat or send
        self._lock = threading.RLock()
        # resolve_code: a program's unpacked bundle (the node's code cache).
        self.processes = ProcessTable(config, store, clock, resolve_code)
        self.events = EventForwarder(
            config.node,
            store,
            control_factory or default_control_factory(config.redis_url),
            send,
        )
        self.commands = CommandHandler(
            config, store, self.processes, self.events, send, self._lock, clock
        )
        self.logs = LogShipper(config.node, LogOffsets(store.redis, config.node), send, clock)
        self.metrics = MetricsFileTail(
            config.node,
            LogOffsets(store.redis, config.node, "metrics"),
            send,
            clock,
            self._metrics_file,
        )
        self.labs = Labs(config, send, on_gone=self._sync_home)
        """The relays of the session labs that run here (``workers.agent.lab``)."""
        self.homes = LabHomes(
            store.redis, config.node, config.artifact_url, limits=config.home_limits
        )
        """The sessions' persistent homes: restored at a lab's start, synced while it runs and
        at its end."""
        self.home_syncs = HomeSyncs(self.homes, clock, config.session_home_sync_s)
        """The homes' syncs, in a thread of their own (``workers.agent.lab.HomeSyncs``)."""
        self.processes.restore_home = self.home_syncs.restore
        self.hardware = probe_for(config.device, [gpu.uuid for gpu in config.gpus])
        """Reads the node's hardware and GPU health for each heartbeat."""
        self._next_heartbeat = clock.monotonic()
        self._next_clean = clock.monotonic() + config.cleanup.every_s
        self._next_quota = clock.monotonic() + config.sandbox.quota.every_s
        self._quota_thread = threading.Thread()
        """The pass holding jobs to their quota (``hold_to_quota``), when one runs."""
        self._next_cache_report = clock.monotonic()  # the first at start
        self._cache_thread = threading.Thread()
        """The pass reporting the environment cache (``report_environments``), when one runs."""
        self._overspent: set[str] = set()
        """Jobs the Redis guard stopped here: their users are not made again (until the job
        has settled here; a retry of it starts afresh)."""
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._collectors: list[threading.Thread] = []
        """Uploads of ended jobs' ARTIFACT_DIR, in flight (``_start_collecting``)."""

    # ------------------------------------------------------------------ commands
    def receive_signed(self, envelope: Any) -> str:
        """Check a command's signature and apply it (``refused`` when it is not ours to obey)."""
        return self.commands.receive_signed(envelope)

    def receive(self, payload: Any) -> str:
        """Parse and apply one command message (``applied``, ``replayed`` or ``rejected``)."""
        return self.commands.receive(payload)

    def apply(self, command: Command) -> str:
        """Apply a parsed command once."""
        return self.commands.apply(command)

    # ------------------------------------------------------------------ supervision
    def restore(self) -> None:
        """Take over what a previous agent process of this node left in Redis.

        Processes still alive are adopted; those gone are reported as lost;
        networks no process needs any more are removed.
        """
        with self._lock:
            for record in self.store.workers():
                if self.processes.has(record.job, record.worker_id):
                    continue
                adopted = self.processes.adopt(record)
                self.events.watch(record.job)
                if not adopted:
                    self._report_exit(record, None, "lost")
            for job, stop in self.store.stops().items():
                self.processes.stops[job] = stop
                self.events.watch(job)
            # Networks of jobs that ended here while no agent ran (nothing to settle).
            busy = {r.job for r in self.processes.records()} | set(self.processes.stops)
            self.processes.isolation.release_leftovers(busy)
            # Homes of labs that ended here while no agent ran: synced before anything
            # settles or cleans their jobs.
            self._sync_homes_left_behind()

    def tick(self) -> None:
        """One supervision pass: reap processes, enforce stops, forward events, heartbeat
        (with it, each job's VXLAN brought up to date with the hosts it is on);
        hold jobs to their quota every ``quota.every_s`` (in a thread of its own); clean the
        node's directories every ``cleanup.every_s``; report the environment cache at start
        and every ``CACHE_REPORT_EVERY_S`` (in a thread of its own)."""
        with self._lock:
            self._reap()
            self.logs.ship(self.processes.records())
            self.metrics.tail(self.processes.records())
            self.processes.enforce_stops()
            for job in list(self.events.jobs):
                self.events.forward(job)
            for job in self.events.past_finish():  # "finished", yet its processes train on
                if self.processes.of_job(job) and job not in self.processes.stops:
                    self.processes.stop(job, f"finished-{job}", grace_seconds=0.0)
            # Before the settling: a stopped session's home sync is queued (the job is
            # reported once it is done), and running labs' periodic syncs.
            self.labs.sync(self.processes.records())
            self.home_syncs.schedule(
                self._lab_home(r.job, r.worker_id) for r in self.processes.records() if is_lab(r)
            )
            self._settle_jobs()
        if self.clock.monotonic() >= self._next_heartbeat:
            self._next_heartbeat = self.clock.monotonic() + self.config.heartbeat_seconds
            self.heartbeat()
            self._restore_job_users()
            self._guard_redis()
            self.processes.isolation.sync()  # jobs' VXLANs reach the hosts that joined them
        if self.clock.monotonic() >= self._next_quota and not self._quota_thread.is_alive():
            self._next_quota = self.clock.monotonic() + self.config.sandbox.quota.every_s
            # In its own thread: walking a job with many files must not delay a heartbeat.
            self._quota_thread = threading.Thread(
                target=self._hold_to_quota_logged, name="quota", daemon=True
            )
            self._quota_thread.start()
        if self.clock.monotonic() >= self._next_clean:
            self._next_clean = self.clock.monotonic() + self.config.cleanup.every_s
            self.clean()
        if self.clock.monotonic() >= self._next_cache_report and not self._cache_thread.is_alive():
            self._next_cache_report = self.clock.monotonic() + CACHE_REPORT_EVERY_S
            # In its own thread: measuring walks every environment's tree.
            self._cache_thread = threading.Thread(
                target=self._report_environments_logged, name="environment-cache", daemon=True
            )
            self._cache_thread.start()

    def _report_environments_logged(self) -> None:
        try:
            self.report_environments()
        except Exception:  # an entry removed mid-walk: the next pass measures again
            log.exception("could not report this node's environment cache")

    def report_environments(self) -> EnvironmentCacheReport:
        """Send the control plane what this node's environment cache holds (``cache_report``),
        and which entries its workers use.  Measured outside the lock (it walks the trees)."""
        with self._lock:
            in_use = set(self.commands.environments_in_use())
        report = cache_report(self.config.node, self.processes.environments, in_use)
        self._send(report)
        return report

    def _hold_to_quota_logged(self) -> None:
        try:
            self.hold_to_quota()
        except Exception:  # a directory gone mid-walk, Redis away: the next pass measures again
            log.exception("could not hold this node's jobs to their quota")

    def hold_to_quota(self) -> list[str]:
        """Stop the jobs here that hold more than their quota on this node (``quota``),
        each reported failed with the reason; return those reasons.

        Measured outside the lock (it walks the directories); stopped under it.
        """
        quota = self.config.sandbox.quota
        with self._lock:
            jobs = sorted({r.job for r in self.processes.records()} - set(self.processes.stops))
        reasons = []
        for job in jobs:
            disk = measure(
                (self.config.job_dir(job), self.config.job_log_dir(job)),
                max_bytes=quota.disk_bytes,
                max_entries=quota.entries,
            )
            shm = measure(
                (self.config.job_shm_dir(job),),
                max_bytes=quota.shm_bytes,
                max_entries=quota.entries,
            )
            reason = verdict(job, self.config.node, disk, shm, quota)
            if reason is None:
                continue
            with self._lock:
                if not self.processes.of_job(job) or job in self.processes.stops:
                    continue  # it ended, or is stopping, meanwhile
                log.warning("%s", reason)
                self.processes.stop(job, f"quota-{job}", grace_seconds=0.0)
            self._send(Failed(node=self.config.node, job=job, error=reason))
            reasons.append(reason)
        return reasons

    def clean(self) -> list[cleanup.Leftover]:
        """Remove ended jobs' node directories and logs and unused bundles (``cleanup``),
        and the least recently used environments past the cache's size (``environments``).

        Measured outside the lock (it walks the directories); decided and
        removed under it, so no job starts here in between.
        """
        leftovers = cleanup.scan(
            self.config.data_dir, self.config.node, self._log_shipped, SHM_ROOT
        )
        with self._lock:
            self._sync_homes_left_behind()  # a home whose last sync failed: tried again
            records = self.processes.records()
            collecting = {t.name.removeprefix("collect-") for t in self._collectors if t.is_alive()}
            collecting |= self.processes.mirror.jobs()
            collecting |= self.home_syncs.jobs()  # a home is synced before its folder goes
            busy_jobs = {r.job for r in records} | set(self.processes.stops) | collecting
            self.processes.isolation.release_leftovers(busy_jobs)
            chosen = cleanup.doomed(
                leftovers,
                now=self.clock.now(),
                settings=self.config.cleanup,
                busy_jobs=frozenset(busy_jobs),
                busy_codes=frozenset(r.code for r in records if r.code is not None),
            )
            removed = cleanup.remove(chosen, now=self.clock.now(), forget_log=self._forget_offsets)
            in_use = {r.environment for r in records if r.environment is not None}
        try:  # outside the lock: only environments no process here runs in go
            self.processes.environments.evict(in_use)
        except OSError:
            log.warning("could not evict environments", exc_info=True)
        return removed

    def _forget_offsets(self, job: str, worker_id: str) -> None:
        """Drop what was read of a worker's log and metrics file (its files were removed)."""
        self.logs.offsets.drop(job, worker_id)
        self.metrics.forget(job, worker_id)

    def _metrics_file(self, record: WorkerLike) -> Path:
        """A torchrun worker's ``METRICS_FILE`` on this node."""
        return JobDirs(self.config.job_dir(record.job)).metrics_file(record.worker_id)

    def _log_shipped(self, job: str, directory: Path) -> bool:
        """Whether every worker log of ``job`` here reached the control plane to its end."""
        for path in directory.glob("*.log"):
            info = path.lstat()
            position = self.logs.offsets.get(job, path.stem)
            if info.st_size == 0:
                continue
            if position is None or position.inode != info.st_ino or position.offset < info.st_size:
                return False
        return True

    def heartbeat(self) -> None:
        """Send a heartbeat now."""
        with self._lock:
            workers = tuple(running(record) for record in self.processes.records())
            free = self.processes.free_slots()
        self._send_heartbeat(
            Heartbeat(
                node=self.config.node,
                device=self.config.device,
                slots=self.config.slots,
                free_slots=free,
                workers=workers,
                address=self.config.address,
                hardware=self.hardware.report(),
            )
        )

    def _reap(self) -> None:
        for exit_ in self.processes.reap():
            self._report_exit(exit_.record, exit_.code, self._outcome(exit_), exit_.reason)

    def _outcome(self, exit_: Exit) -> ExitOutcome:
        if exit_.signalled:
            return "stopped"
        if exit_.code is None:
            # Adopted after a restart: the exit status is not ours to see.
            if exit_.record.job in self.processes.stops:
                return "stopped"
            return "clean" if self.events.ended(exit_.record.job) else "lost"
        return "clean" if exit_.code == 0 else "crashed"

    def _report_exit(
        self, record: WorkerRecord, code: int | None, outcome: ExitOutcome, reason: str = ""
    ) -> None:
        tail = log_tail(record.log_path) if outcome in ("crashed", "lost") else ""
        log.log(
            logging.WARNING if outcome == "crashed" else logging.INFO,
            "worker %s of job %s exited: %s (code %s)",
            record.worker_id,
            record.job,
            outcome,
            code,
        )
        self.events.note_exit(record.job, record.worker_id, outcome, code, record.launcher)
        if not self.processes.of_job(record.job):  # its CHECKPOINT_DIR's last push (torchrun)
            self.processes.mirror.finish(record.job)
        self.logs.flush(record)  # every line before the exit report
        self.metrics.flush(record)  # and every metric
        if outcome in ("clean", "crashed") and not self.processes.of_job(record.job):
            self._start_collecting(record)  # a failed run's outputs help find out why
        self._send(
            WorkerExited(
                node=self.config.node,
                job=record.job,
                worker_id=record.worker_id,
                slot=record.slot,
                exit_code=code,
                outcome=outcome,
                log_tail=tail,
                generation=record.generation,
                reason=reason,
            )
        )

    def _start_collecting(self, record: WorkerRecord) -> None:
        """Upload the job's ``ARTIFACT_DIR`` in the background: never delay a heartbeat."""
        if record.launcher is None or record.store_prefix is None:
            return
        thread = threading.Thread(
            target=self._collect_artifacts, args=(record,), name=f"collect-{record.job}"
        )
        self._collectors = [t for t in self._collectors if t.is_alive()] + [thread]
        thread.start()

    def _collect_artifacts(self, record: WorkerRecord) -> None:
        """Upload what the job's programs left in ``ARTIFACT_DIR`` here, and report it."""
        url = self.config.job_store_url(record.job, record.store_prefix, None)
        try:
            collected = collect(
                ArtifactStore(url),
                self.config.job_dir(record.job) / "artifacts",
                self.config.collect_limits,
            )
        except Exception:  # a store that is down must not take the agent with it
            log.exception("could not collect the artifacts of job %s", record.job)
            return
        for report in collect_reports(self.config.node, record.job, collected):
            self._send(report)

    def _settle_jobs(self) -> None:
        """Forget jobs with nothing left here; report stops and local total failures."""
        syncing = self.home_syncs.jobs()
        for job in list(self.events.jobs):
            if self.processes.of_job(job) or self.processes.mirror.busy(job) or job in syncing:
                continue  # (a restart elsewhere must find the last checkpoint, a session's
                # next start its home: Stopped waits)
            watch = self.events.jobs[job]
            stop = self.processes.stops.pop(job, None)
            if job in self.processes.job_users and (stop is not None or watch.ended):
                self._drop_job_user(job)
            self.processes.release_job(job)
            self._overspent.discard(job)
            if stop is not None:
                self.store.drop_stop(job)
                self._send(Stopped(node=self.config.node, job=job, command_id=stop.command_id))
            elif (error := self.events.lost_reason(watch)) is not None:
                self._send(Failed(node=self.config.node, job=job, error=error))
            self.events.forget(job)

    @property
    def on_own_redis_user(self) -> bool:
        """Whether this agent logs into Redis as its own user (``agent-<node>``), which may
        not read the agents' secret, manage users or measure the server: the control plane
        makes, restores and deletes job users and guards the server's memory
        (``control.agent_users``)."""
        return node_of_url(self.config.redis_url) is not None

    def _guard_redis(self) -> None:
        """Stop this node's jobs that hold more than their share of a full Redis
        (``redis_guard``): their users go, and each is reported failed with the reason.
        Not on the agent's own Redis user (the control plane guards: see above)."""
        if self.on_own_redis_user:
            return
        with self._lock:
            jobs = self.processes.job_users - self._overspent
        try:
            stopped = guard(self.store.redis, jobs)
        except Exception:  # Redis away: the next heartbeat measures again
            log.warning("could not measure this node's jobs in Redis", exc_info=True)
            return
        for each in stopped:
            log.warning("job %s stopped: %s", each.job, each.reason)
            self._overspent.add(each.job)
            self._send(Failed(node=self.config.node, job=each.job, error=each.reason))

    def _restore_job_users(self) -> None:
        """Make the Redis users of this node's jobs again if a restarted Redis lost them
        (not those the guard stopped).  Not on the agent's own Redis user, which may not:
        the control plane restores them on its tick."""
        if self.on_own_redis_user:
            return
        with self._lock:
            jobs = sorted(self.processes.job_users - self._overspent)
        for job in jobs:
            try:
                if restore_job_user(self.store.redis, job):
                    log.warning("Redis had lost the user of job %s: made it again", job)
            except Exception:  # Redis still away: the next heartbeat tries again
                log.warning("could not check the Redis user of job %s", job, exc_info=True)
                return

    def _drop_job_user(self, job: str) -> None:
        self.processes.job_users.discard(job)
        if self.on_own_redis_user:  # the control plane deletes it when the job ends
            return
        try:
            delete_job_user(self.store.redis, job)
        except Exception:  # the control plane deletes it too when it cleans the job up
            log.exception("could not delete the Redis user of job %s", job)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the supervisor thread (idempotent); say whether tenant programs can run."""
        if self._thread is not None:
            return
        refused = self.processes.sandbox_refusal()
        if refused is not None:
            log.error("%s (built-in workloads still run)", refused)
        elif self.config.sandbox.mode == "off":
            log.warning("SANDBOX=off: tenant programs will run unsandboxed")
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

    def _sync_home(self, record: WorkerRecord) -> None:
        """A session's lab has gone: its HOME goes back to the user's persistent home (queued
        after any sync of it under way; the job is reported once it is done)."""
        self.home_syncs.final(self._lab_home(record.job, record.worker_id))

    def _lab_home(self, job: str, worker_id: str) -> LabHome:
        """The HOME of the lab of ``job``/``worker_id`` on this node (its scratch folder)."""
        return LabHome(job, worker_id, JobDirs(self.config.job_dir(job)).scratch(worker_id))

    def _sync_homes_left_behind(self) -> None:
        """Under the lock: queue the last sync of the homes whose labs no longer run here
        (``HomeSyncs.sync_left_behind``)."""
        try:
            self.home_syncs.sync_left_behind(
                self.processes.has, lambda job, worker: self._lab_home(job, worker).path
            )
        except Exception:  # Redis away: the next cleaning pass looks again
            log.exception("could not look for the homes of labs that have ended")

    def close(self, *, stop_children: bool | None = None) -> None:
        """Stop supervising; end the training processes too if so configured.

        By default the processes keep training: a restarted agent adopts them.
        """
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.labs.close()
        if not self.home_syncs.close(timeout=300):  # a final sync in flight finishes first
            log.warning("a lab's home sync is still under way: the next start syncs it")
        if self._quota_thread.is_alive():
            self._quota_thread.join(timeout=30)
        if self._cache_thread.is_alive():
            self._cache_thread.join(timeout=30)
        for collector in self._collectors:  # an upload in flight finishes first
            collector.join(timeout=300)
        self.processes.mirror.close(timeout=300)  # and a final checkpoint push
        if stop_children is None:
            stop_children = self.config.stop_children_on_exit
        if not stop_children:
            return
        with self._lock:
            self.processes.end_all()
            self._reap()
            self.processes.release()

    def running(self) -> list[WorkerRecord]:
        """The processes this agent runs now."""
        with self._lock:
            return [child.record for child in self.processes.children.values()]
