"""The straggler loop on the real stack: slowed worker → report → control plane frees its GPU.

    .venv/bin/python bench/straggler_loop.py                       # one run, a few minutes
    .venv/bin/python bench/straggler_loop.py --redis-db 4 \\
        --database-url postgres://postgres@127.0.0.1:5432/bench_straggler

``manage.py runstack`` starts as ``tests/test_e2e.py`` starts it (daphne,
Celery workers and beat, four node agents, TICK_SECONDS=1, the 8-slot demo
fabric: 2 leaves x 2 servers x 2 slots), on a fresh PostgreSQL database
(``--database-url``: created, dropped at the end; without one, the e2e tests'
throwaway database on ``DATABASE_URL``'s server, else SQLite) and the Redis of
``REDIS_URL`` with db ``--redis-db`` (emptied first).  A tenant (profiling off)
submits an elastic built-in job: ``resnet18-synthetic`` (16x16 images, batch 20,
as ``bench/elastic_scaling.py``), 4 GPUs, min 2.  Once it trains at 4, one
worker that is not the leader is slowed from outside, with no hook in the
product: a thread sends its process SIGSTOP and SIGCONT on a duty cycle
(``--stopped`` of every ``--period``; its pid from ``/proc/*/cmdline``).

Measured, all on this machine's wall clock:

* ``straggler_detect_s``: slowdown start → the ``straggler`` event (the time
  the agent forwarded the runtime's report, which the event keeps);
* ``straggler_remove_s``: that event → the worker's GPU no longer held by the
  job in the database (the control plane's ScaleIn carried out, ``scale_done``
  applied), polled every 50 ms;
* then: the GPU is suspect (``Gpu.suspect_until`` in the future), and a second
  job submitted to take every free GPU (4 GPUs, elastic 1-4) runs without it
  while the job keeps training; neither job holds it for ``--watch`` seconds.

Targets (issue 20, EDL's figures): detection <= 10 s, removal <= 5 s on a quiet
machine.  Timings on a shared 2-core machine are noisy: the load average is in
the output.  The last line is one JSON object.  :func:`control_plane_straggler`
is the measurement for other benchmarks (``bench/elastic_scaling.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_client import ApiClient  # noqa: E402

TARGET_DETECT_S, TARGET_REMOVE_S = 10.0, 5.0
ARGS = {"steps": 1_000_000, "image_size": 16, "num_classes": 10, "lr": 0.01, "seed": 0}
BATCH = 20
POLL_S = 0.05
# Agents miss heartbeats on a loaded machine; a server declared down would requeue the job.
AGENT_DOWN_AFTER_S = "120"


def say(line: str) -> None:
    """One line of the report on stderr, at once (the run takes minutes; stdout ends in JSON)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------------- the stack


class Db:
    """Queries on the stack's database (PostgreSQL, or the SQLite file): reads, and a test's setup writes."""

    def __init__(self, url: str | None, sqlite_path: Path) -> None:
        self.url, self.sqlite_path = url, sqlite_path

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one query in its own short connection (the stack's writers are not held up)."""
        if self.url:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                return list(conn.execute(sql, params).fetchall())
        with contextlib.closing(sqlite3.connect(self.sqlite_path)) as conn:
            return list(conn.execute(sql.replace("%s", "?"), params).fetchall())

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """One write in its own short transaction (a test's setup between two scenarios)."""
        if self.url:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(sql, params)
            return
        with contextlib.closing(sqlite3.connect(self.sqlite_path)) as conn, conn:
            conn.execute(sql.replace("%s", "?"), params)

    def held(self, job: int) -> list[int]:
        """The GPUs ``job`` holds, in rank order (the control plane's rows)."""
        sql = (
            'SELECT g."index" FROM jobs_jobgpu jg JOIN portal_gpu g ON g.id = jg.gpu_id '
            "WHERE jg.job_id = %s ORDER BY jg.rank"
        )
        return [row[0] for row in self.rows(sql, [job])]

    def suspect_until(self, gpu: int) -> datetime | None:
        """When GPU ``gpu``'s suspect mark lapses (None: none)."""
        rows = self.rows('SELECT suspect_until FROM portal_gpu WHERE "index" = %s', [gpu])
        value = rows[0][0] if rows else None
        if isinstance(value, str):  # SQLite keeps text
            value = datetime.fromisoformat(value)
        return value if isinstance(value, datetime) else None


@dataclass
class Stack:
    """A running stack: its API (a tenant's token), its database, its Redis, its log."""

    api: ApiClient
    db: Db
    redis_url: str
    log: Path
    jobs: list[int] = field(default_factory=list)


def _create_database(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop_database(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_stack(*, redis_db: int, database_url: str | None = None) -> Iterator[Stack]:
    """``manage.py runstack`` on a fresh database; a tenant ``bench`` with a token.

    ``database_url`` names a PostgreSQL database to create (and drop at the
    end); None takes ``tests.test_e2e.stack_env``'s throwaway one.
    """
    from devtools.stack import stack_env, start_stack, stop_stack, wait_http
    from utilities.embedded_redis import free_port

    tmp = Path(tempfile.mkdtemp(prefix="straggler-"))
    saved = os.environ.pop("DATABASE_URL", None) if database_url else None
    try:
        env, drop_db = stack_env(
            tmp,
            redis_db=redis_db,
            SECRET_KEY=os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
            AGENT_DOWN_AFTER_SECONDS=AGENT_DOWN_AFTER_S,
            AGENT_WARM_WORKERS="0",  # each worker is its own `workers.elastic.worker` process
        )
    finally:
        if saved is not None:
            os.environ["DATABASE_URL"] = saved
    if database_url:
        _create_database(database_url)
        env["DATABASE_URL"] = database_url
        drop_db = lambda: _drop_database(database_url)  # noqa: E731
    port = free_port()
    proc = start_stack(tmp, port, env)
    try:
        wait_http(f"http://127.0.0.1:{port}/login/", timeout=600)
        manage = [sys.executable, "manage.py"]
        subprocess.run(
            [*manage, "createtenant", "bench", "--owner", "bench", "--gpu-quota", "8",
             "--no-profile"],
            cwd=ROOT, env=env, check=True, capture_output=True,
        )  # fmt: skip
        token = subprocess.run(
            [*manage, "issuetoken", "bench"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        db = Db(env.get("DATABASE_URL"), tmp / "portal.sqlite3")
        redis_url = env.get("REDIS_URL") or _embedded_redis_url(tmp)
        stack = Stack(
            ApiClient(f"http://127.0.0.1:{port}", token), db, redis_url, tmp / "stack.log"
        )
        try:
            yield stack
        finally:
            for job in stack.jobs:
                with contextlib.suppress(Exception):
                    stack.api.call(f"/api/v1/jobs/{job}/cancel/", {})
    finally:
        stop_stack(proc, tmp)
        drop_db()


def _embedded_redis_url(data_dir: Path) -> str:
    port = (data_dir / "redis" / "port").read_text().strip()
    password = (data_dir / "redis" / "password").read_text().strip()
    return f"redis://portal:{password}@127.0.0.1:{port}/0"


# ----------------------------------------------------------------------------- the slowdown


def _training_processes() -> Iterator[tuple[int, set[tuple[str, str]]]]:
    """Each training process on this machine, its pid and its argv's adjacent pairs.

    The Python process itself, not the bubblewrap processes of its sandbox
    (they carry its arguments too): a stopped bubblewrap would slow nothing.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "workers.elastic.worker" not in words or Path(words[0]).name == "bwrap":
            continue
        yield int(entry.name), {(words[i], words[i + 1]) for i in range(len(words) - 1)}


def worker_pid(job: int, worker: str) -> int | None:
    """The pid of ``worker``'s training process of ``job`` (``_training_processes``)."""
    wanted = {("--job", f"job-{job}"), ("--worker", worker)}
    return next((pid for pid, pairs in _training_processes() if wanted <= pairs), None)


def job_pids(job: int) -> list[int]:
    """The training processes of ``job`` still alive on this machine."""
    return [pid for pid, pairs in _training_processes() if ("--job", f"job-{job}") in pairs]


class DutyCycle:
    """Slow one process from outside: SIGSTOP for ``stopped_s`` of every ``period_s``.

    Ends (with a SIGCONT) when stopped or when the process is gone.
    """

    def __init__(self, pid: int, stopped_s: float, period_s: float) -> None:
        self.pid, self.stopped_s, self.period_s = pid, stopped_s, period_s
        self.started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)

    def start(self) -> float:
        """Begin; returns the wall-clock time the first SIGSTOP was sent."""
        self.started_at = time.time()
        self._thread.start()
        return self.started_at

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self._stop.wait(self.stopped_s)
                os.kill(self.pid, signal.SIGCONT)
                self._stop.wait(self.period_s - self.stopped_s)
        except ProcessLookupError:
            return  # the worker left: nothing to slow
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """End the slowdown; the process runs freely again."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


# ----------------------------------------------------------------------------- the loop


def wait_until(what: str, check: Any, timeout: float, interval: float = POLL_S) -> Any:
    """``check()``'s first truthy value, polled every ``interval``; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def _leader(redis_url: str, job: int) -> str | None:
    import redis

    value = redis.Redis.from_url(redis_url).get(f"edl:job-{job}:leader")
    return value.decode() if value else None


def _trained_at(api: ApiClient, job: int, world: int, steps: int) -> bool:
    detail = api.call(f"/api/v1/jobs/{job}/")
    return bool(detail["state"] == "running" and detail["parallelism"] == world) and (
        detail["step"] >= steps
    )


def straggler_loop(
    stack: Stack,
    *,
    gpus: int = 4,
    min_gpus: int = 2,
    stopped_s: float = 0.06,
    period_s: float = 0.1,
    watch_s: float = 15.0,
    timeout_s: float = 300.0,
    follow: bool = True,
    follower_gpus: int = 3,
) -> dict[str, Any]:
    """Slow one worker of a fresh job; what the control plane did and how fast.

    Above ``min_gpus`` the worker is removed; at it (``gpus == min_gpus``) it is
    moved to another GPU, and ``straggler_move_s`` is the time from the event to
    the runtime's switch done.  Returns the measurements and what was checked:
    the event's action, the GPU freed, its mark, and (``follow``) that neither
    this job nor the next one submitted got it back while watched.  The next job
    asks for ``follower_gpus`` (elastic up to 4): the default, 3, is what is
    always free beside the slowed job and the suspect GPU, so it starts at once
    rather than after Tiresias demotes the first job (~90 s when it asked for 4).
    """
    api, db = stack.api, stack.db
    body = {"name": "slowed", "workload": "resnet18-synthetic", "args": ARGS, "batch_size": BATCH,
            "gpus": gpus, "min_gpus": min_gpus, "max_gpus": gpus}  # fmt: skip
    job = int(api.call("/api/v1/jobs/", body)["id"])
    stack.jobs.append(job)
    wait_until(
        f"job {job} to train at {gpus}", lambda: _trained_at(api, job, gpus, 30), timeout_s, 1.0
    )
    held = db.held(job)
    leader = _leader(stack.redis_url, job)
    slow = next(g for g in reversed(held) if f"w{g}" != leader)
    pid = wait_until(f"w{slow}'s process", lambda: worker_pid(job, f"w{slow}"), 30)
    say(f"job {job} trains on GPUs {held} (leader {leader}); slowing w{slow} (pid {pid}): "
        f"stopped {stopped_s * 1000:.0f} ms of every {period_s * 1000:.0f} ms")  # fmt: skip
    duty = DutyCycle(pid, stopped_s, period_s)
    started = duty.start()
    try:

        def straggler_event() -> dict[str, Any] | None:
            # Only what follows the slowdown: on a loaded machine the detector may remove a
            # worker that really was slow before it (CI once saw w0 go 25 s earlier).
            return next(
                (e for e in api.events(job) if e["kind"] == "straggler" and _at(e) >= started),
                None,
            )

        event = wait_until("the straggler event", straggler_event, timeout_s, 0.2)
        seen = time.time()
        freed_at = wait_until(
            f"GPU {slow} to be freed", lambda: time.time() if slow not in db.held(job) else None,
            timeout_s,
        )  # fmt: skip
    finally:
        duty.stop()
    detected = _at(event)
    result: dict[str, Any] = {
        "job": job,
        "gpus_before": held,
        "slowed_worker": f"w{slow}",
        "duty_cycle": f"{stopped_s}/{period_s}",
        "straggler_detect_s": round(detected - started, 3),
        "straggler_seen_s": round(seen - started, 3),
        "straggler_remove_s": round(freed_at - detected, 3),
        "event_action": event["data"].get("action"),
        "event_reason": event["reason"],
        "ratio": event["data"].get("ratio"),
    }
    if result["event_action"] == "moved":
        target = event["data"]["to_gpu"]

        def switch_done() -> dict[str, Any] | None:
            return next(
                (e for e in api.events(job)
                 if e["reason"].startswith("switch done") and _at(e) >= detected),
                None,
            )  # fmt: skip

        try:
            done = wait_until("the move's switch", switch_done, timeout_s, 0.2)
        except TimeoutError as exc:  # say what the job went through instead
            history = [
                f"{e['at'][11:19]} {e['kind']}: {e['reason'][:200]}" for e in api.events(job)
            ]
            raise TimeoutError(f"{exc}; the job's history:\n" + "\n".join(history[-20:])) from None
        result["moved_to"] = target
        result["straggler_move_s"] = round(_at(done) - detected, 3)
        result["job_gpus_moved"] = db.held(job)
        say(f"w{slow} moved to GPU {target}: switch done {result['straggler_move_s']:.2f} s "
            f"after the event; the job holds {result['job_gpus_moved']}")  # fmt: skip
    until = db.suspect_until(slow)
    result["suspect_until"] = until.isoformat() if until else None
    result["suspect"] = bool(until and until.timestamp() > time.time())
    say(f"straggler event {result['straggler_detect_s']:.2f} s after the slowdown began "
        f"(seen by the API at {result['straggler_seen_s']:.2f} s): {event['reason']}")  # fmt: skip
    say(f"GPU {slow} freed {result['straggler_remove_s']:.2f} s after the event; "
        f"suspect until {result['suspect_until']}")  # fmt: skip
    if not follow:
        return result
    # The next job may wait (the policy's call), but the suspect GPU must not be handed
    # out, to it or back to the first job, while it waits or runs.
    body = {"name": "next", "workload": "mlp-digits", "args": {"epochs": 2000},
            "gpus": follower_gpus, "min_gpus": 1, "max_gpus": 4}  # fmt: skip
    submitted = time.monotonic()
    follower = int(api.call("/api/v1/jobs/", body)["id"])
    stack.jobs.append(follower)
    ran_at: float | None = None
    handed_back = False
    while time.monotonic() - submitted < timeout_s:
        held_now = {holder: db.held(holder) for holder in (job, follower)}
        handed_back |= any(slow in gpus_now for gpus_now in held_now.values())
        if ran_at is None and held_now[follower]:
            ran_at = time.monotonic()
        if ran_at is not None and time.monotonic() - ran_at >= watch_s:
            break
        time.sleep(0.5)
    result["next_job_wait_s"] = round(ran_at - submitted, 1) if ran_at is not None else None
    result["next_job_gpus"] = db.held(follower)
    result["job_gpus_after"] = db.held(job)
    result["suspect_gpu_handed_out"] = handed_back
    result["history"] = {
        str(holder): [
            [round(_at(e) - started, 2), e["kind"], e["reason"][:160]] for e in api.events(holder)
        ]
        for holder in (job, follower)
    }
    say(f"next job {follower} ran {result['next_job_wait_s']} s after its submission, on "
        f"{result['next_job_gpus']}; the slowed job holds {result['job_gpus_after']}; "
        f"GPU {slow} handed out again: {handed_back}")  # fmt: skip
    return result


def control_plane_straggler(
    *, redis_db: int = 9, database_url: str | None = None, **loop: Any
) -> dict[str, Any]:
    """The whole measurement on a fresh stack (for ``bench/elastic_scaling.py`` and this CLI)."""
    with running_stack(redis_db=redis_db, database_url=database_url) as stack:
        result = straggler_loop(stack, **loop)
    result["targets"] = {
        "straggler_detect_s": TARGET_DETECT_S,
        "straggler_remove_s": TARGET_REMOVE_S,
    }
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-db", type=int, default=9, help="emptied first (default 9)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL"),
        help="a PostgreSQL database to create and drop (default: a throwaway one on "
        "DATABASE_URL's server, else SQLite)",
    )
    parser.add_argument("--stopped", type=float, default=0.06, help="seconds stopped a period")
    parser.add_argument("--period", type=float, default=0.1, help="the duty cycle's period (s)")
    parser.add_argument("--watch", type=float, default=15.0, help="seconds to watch the GPUs")
    args = parser.parse_args()
    if not 0 < args.stopped < args.period:
        parser.error("--stopped must be between 0 and --period")
    say(f"load average at start: {[round(x, 2) for x in os.getloadavg()]}")
    result = control_plane_straggler(
        redis_db=args.redis_db,
        database_url=args.database_url,
        stopped_s=args.stopped,
        period_s=args.period,
        watch_s=args.watch,
    )
    ok = (
        result["straggler_detect_s"] <= TARGET_DETECT_S,
        result["straggler_remove_s"] <= TARGET_REMOVE_S,
    )
    say(f"detection {result['straggler_detect_s']:.2f} s (target <= {TARGET_DETECT_S:g}: "
        f"{'met' if ok[0] else 'missed'}), removal {result['straggler_remove_s']:.2f} s "
        f"(target <= {TARGET_REMOVE_S:g}: {'met' if ok[1] else 'missed'}), "
        f"load {result['load_avg']}")  # fmt: skip
    print(json.dumps(result))  # the last line: one JSON object
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
