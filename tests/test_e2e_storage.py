"""End to end: a job whose every server dies resumes on other servers from the shared store.

Starts ``manage.py runstack --no-agents`` and four node agents of its own, each
with a data directory of its own and one artifact store between them, an
S3-compatible server (moto, on loopback).  A
4-GPU job trains on two servers; both agents and every training process are
SIGKILLed; the control plane sees the servers go down, requeues the job onto
the two others, and it resumes from its latest checkpoint (step > 0), so
that the samples of the whole run are still used exactly once per epoch
(the runtime's step log), and its final checkpoint, downloaded through the
API, holds the model a single process trains over the same batches.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.stack import agent_key, free_port, stack_env, wait_http
from tests.test_e2e import api, events, job_state, wait_for

ROOT = Path(__file__).resolve().parent.parent
NODES = ("node-0", "node-1", "node-2", "node-3")
pytestmark = [pytest.mark.stack, pytest.mark.slow]

# Long enough that the job is still training when the test kills its servers: at 4 epochs
# a quiet machine could finish it between the checkpoint the test waits for and the kill.
ARGS = {"epochs": 10, "seed": 3}
BATCH = 64


@contextlib.contextmanager
def store_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment that names the shared artifact store, for the stack and every agent.

    S3 only: a shared directory (``file://``) is what every other stack test stores
    to, and a run killed everywhere resuming from one elsewhere is
    ``workers/tests/test_elastic_resume.py``'s ``[file]`` case (the control plane's
    part, requeue and placement, is the same for both stores).
    """
    from devtools.s3_server import moto_s3

    with moto_s3("e2e-artifacts") as s3:
        yield {**s3.env, "ARTIFACT_URL": s3.url}


def start_agent(node: str, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    data = tmp_path / node
    data.mkdir(exist_ok=True)
    log = (tmp_path / f"{node}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "workers.agent", "--node", node, "--gpus", "2", "--cpu",
         "--loglevel", "INFO"],
        cwd=ROOT, env={**env, "PORTAL_DATA_DIR": str(data), "AGENT_KEY": agent_key(env, node)},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    (tmp_path / "steps").mkdir()
    env, drop_db = stack_env(
        tmp_path,
        redis_db=12,
        AGENT_HEARTBEAT_SECONDS="1",
        AGENT_DOWN_AFTER_SECONDS="5",
        # a checkpoint every 5 steps, as the job asks: its run is shorter than the 5 s floor
        CHECKPOINT_MIN_SECONDS="0",
        SCHEDULER_POLICY="tiresias",
        AGENT_STEP_LOG_DIR=str(tmp_path / "steps"),
    )
    with store_env(tmp_path) as store:
        env.update(store)
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port), "--no-agents"],
            cwd=ROOT, env=env, stdout=(tmp_path / "stack.log").open("w+"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        agents: dict[str, subprocess.Popen[bytes]] = {}
        log = (tmp_path / "stack.log").open()
        try:
            wait_http(f"http://127.0.0.1:{port}/login/", timeout=120)
            if "REDIS_URL" not in env:
                from utilities.embedded_redis import recorded_url

                env["REDIS_URL"] = recorded_url(tmp_path)
            for node in NODES:
                agents[node] = start_agent(node, tmp_path, env)
            manage = [sys.executable, "manage.py"]
            subprocess.run([*manage, "createtenant", "e2e", "--owner", "eve", "--gpu-quota", "8",
                            "--no-profile"], cwd=ROOT, env=env, check=True, capture_output=True)  # fmt: skip
            token = subprocess.run(
                [*manage, "issuetoken", "eve"], cwd=ROOT, env=env, check=True,
                capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            yield {
                "url": f"http://127.0.0.1:{port}",
                "token": token,
                "log": log,
                "agents": agents,
                "env": env,
                "tmp": tmp_path,
                "store": "s3",
            }
        finally:
            for agent in agents.values():
                with contextlib.suppress(ProcessLookupError):
                    agent.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
            for agent in agents.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.wait(timeout=30)
            kill_workers(tmp_path)
            drop_db()


def worker_pids(tmp_path: Path, job: str | None = None) -> list[int]:
    """This test's training processes (of ``job`` only, if given): their step log is in tmp."""
    out = []
    mine = str(tmp_path).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(mine in arg for arg in args) or b"workers.elastic.worker" not in args:
            continue
        if job is None or job.encode() in args:
            out.append(int(proc.name))
    return out


def kill_workers(tmp_path: Path, job: str | None = None) -> None:
    for pid in worker_pids(tmp_path, job):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def nodes_of(cluster: dict[str, Any], job: int) -> set[str]:
    """The servers whose agents started the job's training processes (their parents)."""
    parents = set()
    for pid in worker_pids(cluster["tmp"], f"job-{job}"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            parents.add(int(stat.rsplit(")", 1)[1].split()[1]))
    return {node for node, agent in cluster["agents"].items() if agent.pid in parents}


def artifacts(cluster: dict[str, Any], job: int) -> list[dict[str, Any]]:
    return list(api(cluster, f"/api/v1/jobs/{job}/artifacts/")["results"])


def step_records(
    cluster: dict[str, Any], job: int, killed_at: float
) -> tuple[dict[int, list[Any]], dict[int, list[Any]]]:
    """Each committed step's records of the first run and of the run after the kill.

    A worker's log file belongs to the first run if it has a line from
    before the kill (its last lines may come just after: a kill takes a moment).
    """
    first: dict[int, list[Any]] = {}
    second: dict[int, list[Any]] = {}
    for path in (cluster["tmp"] / "steps").glob(f"job-{job}.*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        run = first if any(record["t"] <= killed_at for record in lines) else second
        for record in lines:
            run.setdefault(record["step"], []).append(record)
    return first, second


def download(cluster: dict[str, Any], url: str) -> bytes:
    request = urllib.request.Request(
        urllib.parse.urljoin(cluster["url"], url),
        headers={"Authorization": f"Token {cluster['token']}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def test_a_job_whose_servers_all_die_resumes_elsewhere_from_the_shared_store(
    cluster: dict[str, Any],
) -> None:
    import torch

    from devtools.elastic import check_samples, max_difference, reference_model
    from workers.catalog import validate_args
    from workers.elastic.sampler import ElasticSampler
    from workers.workloads import prepare

    job = api(
        cluster,
        "/api/v1/jobs/",
        {"name": "survivor", "workload": "mlp-digits", "gpus": 4, "min_gpus": 4, "max_gpus": 4,
         "args": ARGS, "batch_size": BATCH, "checkpoint_interval": 5},
    )  # fmt: skip
    name = f"job-{job['id']}"
    wait_for("the job to run", lambda: job_state(cluster, job["id"])["state"] == "running",
             cluster, 120)  # fmt: skip
    wait_for("a checkpoint past step 0",
             lambda: any(a["kind"] == "checkpoint" and (a["step"] or 0) > 0
                         for a in artifacts(cluster, job["id"])), cluster, 120)  # fmt: skip
    doomed = nodes_of(cluster, job["id"])
    assert len(doomed) == 2, (doomed, job_state(cluster, job["id"]))
    # Every server of the job dies at once: its agents and all their processes.
    killed_at = time.time()
    for node in doomed:
        cluster["agents"][node].send_signal(signal.SIGKILL)
    kill_workers(cluster["tmp"], name)
    wait_for("the job to be requeued",
             lambda: any("every server of the job went down" in e["reason"]
                         for e in events(cluster, job["id"])), cluster, 60)  # fmt: skip
    wait_for("the job to run again",
             lambda: nodes_of(cluster, job["id"]).isdisjoint(doomed)
             and job_state(cluster, job["id"])["state"] == "running", cluster, 120)  # fmt: skip
    wait_for("the job to complete",
             lambda: job_state(cluster, job["id"])["state"] == "completed", cluster, 300)  # fmt: skip

    first, second = step_records(cluster, job["id"], killed_at)
    resumed = min(second)
    assert 0 < resumed <= max(first) + 1, "the job started again from step 0"
    records = {**first, **second}  # a step redone after the resume counts once
    full = validate_args("mlp-digits", ARGS)
    prepared = prepare("mlp-digits", full, torch.device("cpu"))
    sampler = ElasticSampler(prepared.num_samples, BATCH, prepared.seed)
    steps = sampler.steps_per_epoch * ARGS["epochs"]
    check_samples(records, sampler, steps, killed=True)

    final = [a for a in artifacts(cluster, job["id"]) if a["kind"] == "final"]
    assert len(final) == 1, artifacts(cluster, job["id"])
    blob = download(cluster, final[0]["download_url"])
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    assert state["step"] == steps
    # float32 workers against a float32 single process: equal up to summation order
    reference = reference_model(full, BATCH, steps, dtype=torch.float32)
    assert max_difference(state["model"], reference) < 1e-3
