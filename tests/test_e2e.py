"""End to end: the real stack trains real jobs, elastically, on the 8-slot demo cluster.

Starts ``manage.py runstack`` (daphne, Celery worker and beat, four node agents,
PostgreSQL and Redis when ``DATABASE_URL``/``REDIS_URL`` are set, else SQLite and
the embedded Redis), submits jobs through the REST API with a token, and
follows them: queued → running, scale-out onto GPUs that another job freed,
scale-in when a new job arrives, completion, JCTs recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_stack import free_port, start_stack, wait_http

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.stack, pytest.mark.slow]


def _throwaway_database(tmp_path: Path) -> tuple[str | None, Callable[[], None]]:
    """A fresh database for the stack: a new PostgreSQL database, or SQLite in tmp."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return None, lambda: None
    import psycopg

    base = url.rsplit("/", 1)[0]
    name = f"e2e_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{base}/{name}", drop


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    db_url, drop_db = _throwaway_database(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        PORTAL_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="portal.settings.dev",
        PYTHONUNBUFFERED="1",
        TICK_SECONDS="1",
        AGENT_HEARTBEAT_SECONDS="2",
        SCHEDULER_POLICY="elastic-tiresias",
        OMP_NUM_THREADS="1",
        DEBUG="0",
    )
    if db_url:
        env["DATABASE_URL"] = db_url
    if os.environ.get("REDIS_URL"):
        redis_url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/11"
        import redis

        redis.Redis.from_url(redis_url).flushdb()
        env["REDIS_URL"] = redis_url
    proc = start_stack(tmp_path, port, env)
    log = (tmp_path / "stack.log").open()
    try:
        wait_http(f"http://127.0.0.1:{port}/login/", timeout=120)
        manage_env = env  # same data dir: the embedded Redis, if any, is shared
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "createtenant",
                "e2e",
                "--owner",
                "eve",
                "--gpu-quota",
                "8",
                "--no-profile",
            ],
            cwd=ROOT,
            env=manage_env,
            check=True,
            capture_output=True,
        )
        token = subprocess.run(
            [sys.executable, "manage.py", "issuetoken", "eve"],
            cwd=ROOT,
            env=manage_env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        yield {"url": f"http://127.0.0.1:{port}", "token": token, "log": log}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
        drop_db()


def api(stack: dict[str, Any], path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        stack["url"] + path,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {stack['token']}", "Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_for(what: str, check: Callable[[], bool], stack: dict[str, Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    stack["log"].seek(0)
    raise AssertionError(f"timed out waiting for {what}\n{stack['log'].read()[-4000:]}")


def events(stack: dict[str, Any], job: int) -> list[dict[str, Any]]:
    return list(api(stack, f"/api/v1/jobs/{job}/events/?page_size=200")["results"])


def job_state(stack: dict[str, Any], job: int) -> dict[str, Any]:
    return dict(api(stack, f"/api/v1/jobs/{job}/"))


def test_jobs_queue_start_scale_out_scale_in_and_complete(stack: dict[str, Any]) -> None:
    def submit(name: str, gpus: int, epochs: int, **extra: int) -> dict[str, Any]:
        body = {"name": name, "workload": "mlp-digits", "gpus": gpus, "args": {"epochs": epochs}}
        return dict(api(stack, "/api/v1/jobs/", {**body, **extra}))

    # The cluster (8 slots) fills up: A runs at its request, elastic up to 4 GPUs.
    a = submit("a", 2, 400, min_gpus=2, max_gpus=4)
    b = submit("b", 4, 3)
    d = submit("d", 2, 250)
    assert a["state"] == b["state"] == d["state"] == "queued"
    wait_for(
        "A, B and D to run",
        lambda: all(
            job_state(stack, j["id"])["state"] in ("running", "scaling", "completed")
            for j in (a, b, d)
        ),
        stack,
        120,
    )
    # B's GPUs come free: A grows onto them without stopping.
    wait_for("B to complete", lambda: job_state(stack, b["id"])["state"] == "completed", stack, 240)
    wait_for(
        "A to scale out",
        lambda: any(e["reason"].startswith("scale out") for e in events(stack, a["id"])),
        stack,
        60,
    )
    wait_for(
        "A's switch to finish", lambda: job_state(stack, a["id"])["parallelism"] == 4, stack, 180
    )
    # A newcomer needs GPUs: A's extra GPUs are reclaimed by a stop-free scale-in.
    c = submit("c", 4, 3)
    wait_for(
        "A to scale in",
        lambda: any(e["reason"].startswith("scale in") for e in events(stack, a["id"])),
        stack,
        60,
    )
    for job in (c, d, a):
        wait_for(
            f"{job['name']} to complete",
            lambda job=job: job_state(stack, job["id"])["state"] == "completed",
            stack,
            480,
        )

    history = events(stack, a["id"])
    switches = [e for e in history if e["reason"].startswith("switch done")]
    assert len(switches) >= 2, history  # scale-out and scale-in, A never restarted
    assert all(e["kind"] != "preempted" for e in history)  # never stopped and requeued either
    final = job_state(stack, a["id"])
    assert final["jct_seconds"] and final["attained_gpu_seconds"] > 0
    stats = api(stack, "/api/v1/stats/jct/?tenant=e2e")
    assert stats["count"] == 4 and stats["mean"] > 0
