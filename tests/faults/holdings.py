"""Who holds which GPU, by the database and by the live processes, watched through a fault.

Two views of the cluster, sampled twice a second while a scenario runs:

    database   jobs_jobgpu ──> (job, its state, GPU index)
    processes  training processes of the test ──> (job, GPU index from ``--worker w<gpu>``)

A condition is a violation only if it lasts longer than its allowance (a job
is placed a moment before its processes start; a finished job's processes
exit a moment after its GPUs are freed):

    held twice          two live processes train on one GPU
    held by the dead    a GPU row of a job whose process on that GPU died
                        (the runtime or the tick's reconcile step must free it)
    not started         a GPU row of a job that never had a process on that GPU
                        (an agent may wait for the slot: RECONCILE_START_SECONDS)
    orphan process      a process trains on a GPU the database gives to no job, or another
    ended job holds     a GPU row of a job in a terminal state
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.processes import TrainingProc, training_processes

ACTIVE = ("running", "scaling")


@dataclass(frozen=True)
class Held:
    """A GPU row: job ``job_id`` (in ``state``) holds the GPU of global index ``gpu``."""

    job_id: int
    state: str
    gpu: int


@dataclass(frozen=True)
class ClusterDb:
    """Read-only access to the stack's database: PostgreSQL by URL, else its SQLite file."""

    database_url: str | None
    sqlite_path: Path

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        if self.database_url:
            import psycopg

            with psycopg.connect(self.database_url, connect_timeout=3) as conn:
                return [tuple(row) for row in conn.execute(sql).fetchall()]
        with sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=3) as conn:
            return [tuple(row) for row in conn.execute(sql).fetchall()]

    def held(self) -> list[Held]:
        """Every GPU row, with its job's state."""
        rows = self.rows(
            'SELECT h.job_id, j.state, g."index" FROM jobs_jobgpu h '
            "JOIN jobs_job j ON j.id = h.job_id JOIN portal_gpu g ON g.id = h.gpu_id"
        )
        return [Held(int(str(job)), str(state), int(str(gpu))) for job, state, gpu in rows]


@dataclass(frozen=True)
class Allowances:
    """How long (seconds) each condition may last before it is a violation."""

    held_twice: float = 5.0
    held_by_the_dead: float = 12.0
    not_started: float = 72.0
    orphan_process: float = 15.0
    ended_job_holds: float = 5.0


def conditions(
    held: Iterable[Held], procs: Iterable[TrainingProc], started: Collection[tuple[int, int]] = ()
) -> dict[str, str]:
    """The suspicious conditions of one sample, keyed so that a lasting one keeps its key.

    ``started`` holds the (job, GPU) pairs that had a process at some earlier
    sample: a row without one is then held by the dead, else not started yet.
    """
    found: dict[str, str] = {}
    on_gpu: dict[int, list[TrainingProc]] = {}
    for proc in procs:
        on_gpu.setdefault(proc.gpu, []).append(proc)
    for gpu, owners in on_gpu.items():
        if len(owners) > 1:
            who = ", ".join(f"{p.job}/{p.worker} (pid {p.pid})" for p in owners)
            found[f"held twice: gpu {gpu}"] = f"gpu {gpu} has {len(owners)} processes: {who}"
    rows = {row.gpu: row for row in held}
    for row in rows.values():
        if row.state not in ACTIVE:
            found[f"ended job holds: gpu {row.gpu}"] = (
                f"gpu {row.gpu} is held by job {row.job_id}, which is {row.state}"
            )
        elif not any(p.job == f"job-{row.job_id}" for p in on_gpu.get(row.gpu, [])):
            if (row.job_id, row.gpu) in started:
                found[f"held by the dead: gpu {row.gpu} job {row.job_id}"] = (
                    f"gpu {row.gpu} is held by job {row.job_id} ({row.state}), "
                    "whose process on it died"
                )
            else:
                found[f"not started: gpu {row.gpu} job {row.job_id}"] = (
                    f"gpu {row.gpu} is held by job {row.job_id} ({row.state}), "
                    "which never had a process on it"
                )
    for gpu, owners in on_gpu.items():
        for proc in owners:
            row = rows.get(gpu)
            if row is None or f"job-{row.job_id}" != proc.job:
                found[f"orphan process: pid {proc.pid}"] = (
                    f"{proc.job}/{proc.worker} (pid {proc.pid}) trains on gpu {gpu}, which the "
                    f"database gives to {'no job' if row is None else f'job {row.job_id}'}"
                )
    return found


def allowance_of(key: str, allowances: Allowances) -> float:
    """The allowance of a condition key (its prefix names the kind)."""
    kind = key.split(":", 1)[0].replace(" ", "_")
    return float(getattr(allowances, kind))


@dataclass
class HoldingsMonitor:
    """Samples both views in a thread; remembers every condition that outlived its allowance."""

    db: ClusterDb
    step_dir: Path
    allowances: Allowances = field(default_factory=Allowances)
    journal: Path | None = None  # each condition's start and end, for the post-mortem
    period_s: float = 0.5
    violations: dict[str, str] = field(default_factory=dict)
    samples: int = 0
    _started: set[tuple[int, int]] = field(default_factory=set)
    _since: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="holdings-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sample(self) -> None:
        """Take one sample: both views, then age every condition seen."""
        try:
            held = self.db.held()
        except Exception:  # the database is restarting: no sample, nothing forgotten
            return
        now = time.monotonic()
        procs = training_processes(self.step_dir)
        found = conditions(held, procs, self._started)
        self._started |= {
            (row.job_id, row.gpu)
            for row in held
            for p in procs
            if p.gpu == row.gpu and p.job == f"job-{row.job_id}"
        }
        self._note(
            [f"+ {found[key]}" for key in found.keys() - self._since.keys()]
            + [
                f"- {key} (after {now - self._since[key]:.1f} s)"
                for key in self._since.keys() - found.keys()
            ]
        )
        self._since = {key: self._since.get(key, now) for key in found}
        for key, detail in found.items():
            lasted = now - self._since[key]
            if lasted > allowance_of(key, self.allowances):
                self.violations[key] = f"{detail} (for {lasted:.0f} s)"
        self.samples += 1

    def _note(self, lines: list[str]) -> None:
        if self.journal is not None and lines:
            stamp = time.strftime("%H:%M:%S")
            with self.journal.open("a") as journal:
                journal.writelines(f"{stamp} {line}\n" for line in lines)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)
