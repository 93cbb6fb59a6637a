"""A real stack for fault tests: ``runstack`` on the test's own services, its API, its tiny jobs.

    FaultStack
      ├── runstack (daphne, Celery worker + beat, four agents of two CPU slots each)
      ├── REDIS_URL    the test's RedisServer (append-only), database 13
      ├── DATABASE_URL a throwaway PostgreSQL database, or SQLite in the data directory
      ├── AGENT_STEP_LOG_DIR  <root>/steps: the runtime's step logs (every committed batch)
      └── HoldingsMonitor     GPU rows and training processes, sampled while it runs

Jobs are ``mlp-digits`` at two GPUs with a small hidden layer: a few seconds of
training (1305 mini-batches) after a few seconds of process start, so a fault
lands mid-run and recovery is measured, not waited out.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.stack import migrated_template
from tests.faults.holdings import Allowances, ClusterDb, HoldingsMonitor
from tests.faults.processes import Proc, stack_roles, training_processes
from tests.faults.services import RedisServer, ThrowawayPostgres, free_port
from tests.faults.steplog import as_sample_records, committed_steps, read_step_logs

ROOT = Path(__file__).resolve().parents[2]
REDIS_DB = 13
ARGS = {"hidden": 16, "seed": 3}
EPOCHS = 45
BATCH = 64
CHECKPOINT_EVERY = 20
RECONCILE_SECONDS = 5
RECONCILE_START_SECONDS = 15
# Fast control loop: the tick every second, a job whose workers no heartbeat lists
# for 5 s is reconciled. A server is down after the default 20 s of silence: an
# agent that runstack restarts is back well before (and adopts its processes).
TIMINGS = {
    "TICK_SECONDS": "1",
    "AGENT_HEARTBEAT_SECONDS": "1",
    "AGENT_DOWN_AFTER_SECONDS": "20",
    "RECONCILE_SECONDS": str(RECONCILE_SECONDS),
    # No test job waits for a slot (no process outlives its job): a job never seen
    # running may be reaped soon after its placement.
    "RECONCILE_START_SECONDS": str(RECONCILE_START_SECONDS),
    # A checkpoint within a second of the start: a fault then lands early in a run.
    "CHECKPOINT_MIN_SECONDS": "1",
}
# A GPU row with no process on it is freed (or given a process) within the reconcile
# time and a few ticks; anything else may last a moment (a process starting, exiting).
ALLOWANCES = Allowances(
    held_by_the_dead=RECONCILE_SECONDS + 7.0, not_started=RECONCILE_START_SECONDS + 7.0
)


@dataclass
class FaultStack:
    """A running ``runstack`` and what a fault test needs to drive and check it."""

    root: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    url: str = ""
    token: str = ""
    monitor: HoldingsMonitor | None = None
    submitted: list[int] = field(default_factory=list)
    epochs: dict[int, int] = field(default_factory=dict)

    @property
    def step_dir(self) -> Path:
        return self.root / "steps"

    @property
    def db(self) -> ClusterDb:
        return ClusterDb(self.env.get("DATABASE_URL"), self.root / "portal.sqlite3")

    # -- the API -----------------------------------------------------------------------
    def api(self, path: str, body: dict[str, Any] | None = None, attempts: int = 20) -> Any:
        """Call the REST API with the test's token; retried while a service restarts."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        for attempt in range(attempts):
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == attempts - 1:
                    raise
            except OSError:
                if attempt == attempts - 1:
                    raise
            time.sleep(0.5)
        raise AssertionError("unreachable")

    def submit(self, name: str, epochs: int = EPOCHS) -> int:
        """Submit a tiny two-GPU job; its id."""
        job = self.api(
            "/api/v1/jobs/",
            {"name": name, "workload": "mlp-digits", "gpus": 2, "min_gpus": 2, "max_gpus": 2,
             "args": {**ARGS, "epochs": epochs}, "batch_size": BATCH,
             "checkpoint_interval": CHECKPOINT_EVERY},
        )  # fmt: skip
        self.submitted.append(int(job["id"]))
        self.epochs[int(job["id"])] = epochs
        return int(job["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.api(f"/api/v1/jobs/{job_id}/"))

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return list(self.api(f"/api/v1/jobs/{job_id}/events/?page_size=200")["results"])

    def artifacts(self, job_id: int) -> list[dict[str, Any]]:
        return list(self.api(f"/api/v1/jobs/{job_id}/artifacts/")["results"])

    def download(self, url: str) -> bytes:
        request = urllib.request.Request(
            urllib.parse.urljoin(self.url, url), headers={"Authorization": f"Token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    # -- waiting -----------------------------------------------------------------------
    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        """Poll ``check`` until true; the seconds it took. A timeout fails with the logs."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(OSError):
                if check():
                    return time.monotonic() - started
            time.sleep(0.3)
        raise AssertionError(f"timed out ({timeout:.0f} s) waiting for {what}\n{self.log_tail()}")

    def wait_running_past_checkpoint(self, job_id: int, timeout: float = 180) -> None:
        """Until the job runs and has a checkpoint past step 0 (a fault then lands mid-run)."""
        self.wait_for(
            f"job {job_id} to run with a checkpoint",
            lambda: self.job(job_id)["state"] == "running"
            and any(a["kind"] == "checkpoint" and (a["step"] or 0) > 0
                    for a in self.artifacts(job_id)),
            timeout,
        )  # fmt: skip

    def wait_completed(self, job_ids: list[int], timeout: float = 240) -> None:
        for job_id in job_ids:
            self.wait_for(f"job {job_id} to complete", lambda j=job_id: self._ended(j), timeout)
            state = self.job(job_id)["state"]
            assert state == "completed", f"job {job_id} ended {state}: {self.events(job_id)}"

    def wait_processes_gone(self, job_ids: list[int], timeout: float = 30) -> None:
        """Until no training process of the jobs is left: none outlives its job."""
        names = {f"job-{job_id}" for job_id in job_ids}
        self.wait_for(
            f"the processes of jobs {sorted(job_ids)} to exit",
            lambda: not [p for p in training_processes(self.step_dir) if p.job in names],
            timeout,
        )

    def cancel_unfinished(self, job_ids: list[int]) -> None:
        """Cancel those of the jobs still queued or running, and wait for their processes."""
        alive = [job_id for job_id in job_ids if not self._ended(job_id)]
        for job_id in alive:
            with contextlib.suppress(urllib.error.HTTPError):
                self.api(f"/api/v1/jobs/{job_id}/cancel/", {})
        with contextlib.suppress(AssertionError):
            self.wait_processes_gone(alive, timeout=60)

    def _ended(self, job_id: int) -> bool:
        return self.job(job_id)["state"] in ("completed", "failed", "cancelled")

    # -- processes ---------------------------------------------------------------------
    def roles(self) -> dict[str, Proc]:
        return stack_roles(self.proc.pid)

    def log_tail(self, chars: int = 6000) -> str:
        return (self.root / "stack.log").read_text(errors="replace")[-chars:]

    # -- the promises ------------------------------------------------------------------
    def assert_trained_once(self, job_id: int) -> None:
        """Every step committed once over its batch, every sample once per epoch, right model."""
        import torch

        from devtools.elastic import check_samples, max_difference

        epochs = self.epochs[job_id]
        sampler, reference = single_process_run(epochs)
        steps = sampler.steps_per_epoch * epochs
        committed = committed_steps(read_step_logs(self.step_dir, f"job-{job_id}"))
        check_samples(as_sample_records(committed), sampler, steps, killed=True)
        final = [a for a in self.artifacts(job_id) if a["kind"] == "final"]
        assert len(final) == 1, self.artifacts(job_id)
        blob = self.download(final[0]["download_url"])
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        assert state["step"] == steps
        # float32 workers against a float32 single process: equal up to summation order
        assert max_difference(state["model"], reference) < 1e-3, "the model saw other batches"

    def assert_no_gpu_held(self) -> None:
        """Nothing holds a GPU once every job ended; the monitor saw no violation on the way."""
        assert self.db.held() == [], self.db.held()
        if self.monitor is not None:
            self.monitor.sample()
            assert self.monitor.samples > 0
            assert not self.monitor.violations, "\n".join(self.monitor.violations.values())

    # -- life --------------------------------------------------------------------------
    def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in [p.pid for p in training_processes(self.step_dir)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


DATABASE_NAME = "fault_suite"


@contextlib.contextmanager
def throwaway_database(server_url: str | None = None) -> Iterator[str | None]:
    """A fresh ``fault_suite`` database on ``server_url`` (default: ``DATABASE_URL``'s server).

    Yields its URL, or None without PostgreSQL (the stack then makes its SQLite file).
    It is a copy of the server's migrated template (``devtools.stack.migrated_template``):
    on ``DATABASE_URL``'s server the one every stack copies, on the fault tests' own
    cluster the one their modules share.
    """
    url = server_url or os.environ.get("DATABASE_URL")
    if not url:
        yield None
        return
    import psycopg

    base = url.rsplit("/", 1)[0]
    template = migrated_template(base)

    def drop() -> None:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE_NAME}" WITH (FORCE)')

    drop()
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE_NAME}" TEMPLATE "{template}"')
    try:
        yield f"{base}/{DATABASE_NAME}"
    finally:
        drop()


@functools.cache
def single_process_run(epochs: int) -> tuple[Any, dict[str, Any]]:
    """The sampler of a test job of ``epochs``, and its model trained by one process.

    Every test job of that many epochs has the same data, seed and batches: one
    reference serves them all.
    """
    import torch

    from devtools.elastic import reference_model
    from workers.catalog import validate_args
    from workers.elastic.sampler import ElasticSampler
    from workers.workloads import prepare

    full = validate_args("mlp-digits", {**ARGS, "epochs": epochs})
    prepared = prepare("mlp-digits", full, torch.device("cpu"))
    sampler = ElasticSampler(prepared.num_samples, BATCH, prepared.seed)
    steps = sampler.steps_per_epoch * epochs
    return sampler, reference_model(full, BATCH, steps, dtype=torch.float32)


def stack_env(root: Path, *, redis_url: str, database_url: str | None) -> dict[str, str]:
    """runstack's environment: the test's services, fast timings, step logs under ``root``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(TIMINGS)
    env.update(
        PORTAL_DATA_DIR=str(root),
        DJANGO_SETTINGS_MODULE="portal.settings.dev",
        PYTHONUNBUFFERED="1",
        SCHEDULER_POLICY="tiresias",
        OMP_NUM_THREADS="1",
        DEBUG="0",
        REDIS_URL=redis_url,
        AGENT_STEP_LOG_DIR=str(root / "steps"),
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


_TENANT_SCRIPT = """
from tenancy.services import do_create_tenant
from tenancy.token_services import do_issue_token
do_create_tenant(slug="faults", owner_username="fay", password={password!r},
                 gpu_quota=8, profile_jobs=False)
from django.contrib.auth import get_user_model
print("TOKEN", do_issue_token(user=get_user_model().objects.get(username="fay")))
"""


@contextlib.contextmanager
def stack_on_postgres(
    root: Path, redis: RedisServer, postgres: ThrowawayPostgres, extra: dict[str, str] | None = None
) -> Iterator[FaultStack]:
    """A stack on a throwaway database of ``postgres`` (a cluster its test may stop) and
    ``redis``, with ``extra`` settings; stopped at the end."""
    postgres.ensure_started()
    with throwaway_database(postgres.url("postgres")) as database_url:
        env = stack_env(root, redis_url=redis.url(REDIS_DB), database_url=database_url)
        env.update(extra or {})
        running = boot(root, env)
        try:
            yield running
        finally:
            running.stop()


def boot(root: Path, env: dict[str, str], timeout: float = 180) -> FaultStack:
    """Start runstack; once migrated, make the test's tenant and token while the rest boots."""
    (root / "steps").mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (root / "stack.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stack = FaultStack(root=root, env=env, proc=proc, url=f"http://127.0.0.1:{port}")
    try:
        stack.wait_for(
            "runstack to migrate",
            lambda: proc.poll() is None and "GPU portal:" in stack.log_tail(100_000),
            timeout,
        )
        script = _TENANT_SCRIPT.format(password=secrets.token_urlsafe(16))
        made = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", script],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        stack.token = made.stdout.split("TOKEN", 1)[1].strip()
        stack.wait_for("the stack to serve", lambda: _answers(stack.url + "/login/"), timeout)
        stack.wait_for("four agents", lambda: _agents_up(stack) == 4, timeout)
    except BaseException:
        stack.stop()
        raise
    stack.monitor = HoldingsMonitor(
        stack.db, stack.step_dir, ALLOWANCES, journal=root / "holdings.log"
    )
    stack.monitor.start()
    return stack


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return int(response.status) == 200


def _agents_up(stack: FaultStack) -> int:
    rows = stack.db.rows("SELECT COUNT(*) FROM portal_server WHERE last_heartbeat IS NOT NULL")
    return int(str(rows[0][0]))
