"""A small driver for real multi-process elastic jobs, shared by the tests and the benchmark.

It starts worker processes (``python -m workers.elastic.worker``), talks to the
job through ``JobControl`` like the node agent does, and offers the checks a
scenario ends with: every sample of the epoch used exactly once, and the final
model equal to a single-process reference run of the same global batches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workers.artifacts import ArtifactStore
from workers.elastic import phases
from workers.elastic.checkpoint import Checkpoints
from workers.elastic.control import JobControl
from workers.elastic.sampler import ElasticSampler

REPO = Path(__file__).resolve().parents[1]


@dataclass
class JobRun:
    """One elastic job of real worker processes on this machine.

    ``workdir`` holds this run's logs (the step logs the checks read);
    ``store_url`` is the job's artifact store (default ``<workdir>/store``):
    two runs with different workdirs and one store are the job moved to other nodes.
    """

    redis_url: str
    job_id: str
    workdir: Path
    workload: str = "mlp-digits"
    args: dict[str, Any] = field(default_factory=lambda: {"epochs": 1000, "hidden": 32, "seed": 3})
    batch_size: int = 64
    recovery: str = "consistent"
    checkpoint_every: int = 10
    sync_timeout_s: float = 10.0
    extra: list[str] = field(default_factory=lambda: ["--dtype", "float64"])
    store_url: str = ""
    device: str = "cpu"
    """``cpu``, ``cuda:K`` (every worker there), or ``cuda`` (worker ``w<i>`` on GPU ``i mod n``)."""
    comm: str = "auto"
    """The workers' ``--comm``: ``gloo`` lets several workers share one GPU."""
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    last_event: str = "0"
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.control = JobControl(self.redis_url, self.job_id)
        self.control.cleanup()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        if not self.store_url:
            self.store_url = str(self.workdir / "store")

    @property
    def checkpoints(self) -> Checkpoints:
        """The job's checkpoints, as any worker reads them."""
        return Checkpoints(ArtifactStore(self.store_url))

    def command(self, worker: str, initial_world: int | None, extra: list[str]) -> list[str]:
        cmd = [
            sys.executable, "-m", "workers.elastic.worker",
            "--job", self.job_id, "--worker", worker, "--workload", self.workload,
            "--args", json.dumps(self.args), "--batch-size", str(self.batch_size),
            "--recovery", self.recovery, "--store-url", self.store_url,
            "--checkpoint-every", str(self.checkpoint_every), "--redis-url", self.redis_url,
            "--step-log", str(self.workdir / "logs" / f"{worker}.jsonl"),
            "--sync-timeout", str(self.sync_timeout_s),
            "--device", self.device_for(worker), "--comm", self.comm,
        ]  # fmt: skip
        if initial_world is not None:
            cmd += ["--initial-world", str(initial_world)]
        return cmd + self.extra + extra

    def device_for(self, worker: str) -> str:
        """The ``--device`` of ``worker`` (see ``device``)."""
        if self.device != "cuda":
            return self.device
        digits = worker[1:] if worker[1:].isdigit() else "0"
        return f"cuda:{int(digits) % max(1, torch.cuda.device_count())}"

    def start(self, worker: str, initial_world: int | None = None, extra: list[str] = ()) -> None:  # type: ignore[assignment]
        """Launch one worker process (``initial_world`` set: a generation-0 member)."""
        out = open(self.workdir / "logs" / f"{worker}.out", "ab")  # noqa: SIM115
        self.procs[worker] = subprocess.Popen(
            self.command(worker, initial_world, list(extra)),
            cwd=REPO,
            env=self._env(worker),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def start_warm(self, worker: str, build_ahead: bool = True) -> None:
        """Launch a warm process (``workers.elastic.warm``) that will become ``worker``.

        ``build_ahead``: it also builds this job's workload while it waits.
        ``assign`` then hands it its command line.
        """
        cmd = [sys.executable, "-m", "workers.elastic.warm"]
        if build_ahead:
            cmd += ["--workload", self.workload, "--args", json.dumps(self.args)]
            cmd += ["--device", self.device_for(worker)]
            if "--dtype" in self.extra:
                cmd += ["--dtype", self.extra[self.extra.index("--dtype") + 1]]
        out = open(self.workdir / "logs" / f"{worker}.out", "ab")  # noqa: SIM115
        self.procs[worker] = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=self._env(worker),
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def wait_warm(self, worker: str, timeout: float = 300.0) -> None:
        """Wait until the warm process of ``worker`` has imported and built everything."""
        deadline = time.monotonic() + timeout
        while "warm" not in self.phases(worker):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{worker} did not warm up within {timeout}s:\n{self.tail()}")
            if self.procs[worker].poll() is not None:
                raise RuntimeError(f"the warm process of {worker} exited:\n{self.tail()}")
            time.sleep(0.05)

    def assign(self, worker: str, initial_world: int | None = None, extra: list[str] = ()) -> None:  # type: ignore[assignment]
        """Hand the warm process of ``worker`` its command line (it joins the job now)."""
        proc = self.procs[worker]
        assert proc.stdin is not None, f"{worker} is not a warm process"
        argv = self.command(worker, initial_world, list(extra))[3:]  # without python -m module
        proc.stdin.write((json.dumps(argv) + "\n").encode())
        proc.stdin.close()

    def phases(self, worker: str) -> dict[str, float]:
        """When ``worker`` reached each start-up phase (``workers.elastic.phases``)."""
        return phases.read(str(self.workdir / "logs" / f"{worker}.phases"))

    def _env(self, worker: str) -> dict[str, str]:
        phase_log = str(self.workdir / "logs" / f"{worker}.phases")
        return dict(
            os.environ,
            **self.env,
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
            **{phases.PHASE_LOG_ENV: phase_log},
        )

    def start_initial(self, n: int, extra: dict[str, list[str]] | None = None) -> list[str]:
        workers = [f"w{i}" for i in range(n)]
        for w in workers:
            self.start(w, n, (extra or {}).get(w, []))
        return workers

    def kill(self, worker: str) -> None:
        self.procs[worker].send_signal(signal.SIGKILL)

    def poll_events(self, block_ms: int = 200) -> list[tuple[str, dict[str, Any]]]:
        new = self.control.read_events(self.last_event, block_ms=block_ms)
        if new:
            self.last_event = new[-1][0]
            self.events += new
        return new

    def wait_event(
        self,
        kind: str,
        timeout: float = 60.0,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
    ) -> dict[str, Any]:
        """Wait for (and return) the first event of ``kind`` matching ``where`` not yet consumed."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for _id, event in self.events[seen:]:
                if event["kind"] == kind and where(event) and not event.get("_used"):
                    event["_used"] = True
                    return event
            seen = len(self.events)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} event within {timeout}s; log tail:\n{self.tail()}")
            dead = {w: p.returncode for w, p in self.procs.items() if p.poll() not in (None, 0)}
            if dead and kind not in ("worker_failed", "recovered"):
                killed = {w for w, rc in dead.items() if rc == -signal.SIGKILL}
                if set(dead) - killed:
                    raise RuntimeError(f"workers failed: {dead}\n{self.tail()}")
            self.poll_events()

    def wait_step(self, step: int, timeout: float = 60.0) -> dict[str, Any]:
        return self.wait_event("progress", timeout, lambda e: e["step"] >= step)

    def stop_and_wait(self, timeout: float = 60.0) -> int:
        """Graceful stop; return the step at which the job stopped."""
        self.control.request_stop("test over")
        event = self.wait_event("finished", timeout)
        self.wait_exit(timeout)
        return int(event["step"])

    def wait_exit(self, timeout: float = 60.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for worker, proc in self.procs.items():
            try:
                codes[worker] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[worker] = -999
        return codes

    def terminate(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def tail(self, lines: int = 15) -> str:
        chunks = []
        for path in sorted((self.workdir / "logs").glob("*.out")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"== {path.name}\n" + "\n".join(text))
        return "\n".join(chunks)

    # -- checks ------------------------------------------------------------------------
    def step_records(self) -> dict[int, list[dict[str, Any]]]:
        """Per step, the records of the generation that last ran it (replays win)."""
        by_step: dict[int, list[dict[str, Any]]] = {}
        for path in (self.workdir / "logs").glob("*.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                by_step.setdefault(rec["step"], []).append(rec)
        final: dict[int, list[dict[str, Any]]] = {}
        for step, recs in by_step.items():
            last_gen = max(r["gen"] for r in recs)
            final[step] = [r for r in recs if r["gen"] == last_gen]
        return final

    def step_records_raw(self) -> list[dict[str, Any]]:
        """Every step record of every worker, replays included."""
        out: list[dict[str, Any]] = []
        for path in (self.workdir / "logs").glob("*.jsonl"):
            out += [json.loads(line) for line in path.read_text().splitlines()]
        return out

    def final_model(self) -> dict[str, torch.Tensor]:
        restored, skipped = self.checkpoints.load_latest()
        assert restored is not None and not skipped, ("no checkpoint", skipped)
        model: dict[str, torch.Tensor] = restored.state["model"]
        return model


def step_records_of(runs: list[JobRun]) -> dict[int, list[dict[str, Any]]]:
    """``step_records`` of one job run in turn by ``runs`` (a later run's replay of a step wins).

    Generations count from 0 again in each run, so they are renumbered
    (``1000 * run + gen``) to stay distinct for ``check_samples``.
    """
    merged: dict[int, list[dict[str, Any]]] = {}
    for index, run in enumerate(runs):
        for step, records in run.step_records().items():
            merged[step] = [{**r, "gen": 1000 * index + r["gen"]} for r in records]
    return merged


def check_samples(
    records: dict[int, list[dict[str, Any]]],
    sampler: ElasticSampler,
    steps: int,
    killed: bool = False,
) -> None:
    """Every step 0..steps-1 ran once over exactly its global batch; epochs use each sample once.

    A SIGKILLed worker may die between committing a step and logging it: with
    ``killed``, the last step of a generation may lack records, and its missing
    shards are then taken from the sampler (the records present must match it).
    """
    assert sorted(records) == list(range(steps)), "steps missing or extra"
    last_of_gen: dict[int, int] = {}
    for step, recs in records.items():
        gen = recs[0]["gen"]
        last_of_gen[gen] = max(last_of_gen.get(gen, -1), step)
    per_epoch: dict[int, list[int]] = {}
    for step in range(steps):
        recs = records[step]
        worlds = {r["world"] for r in recs}
        assert len(worlds) == 1, f"step {step}: mixed memberships"
        world = worlds.pop()
        ranks = [r["rank"] for r in recs]
        assert len(ranks) == len(set(ranks)), f"step {step}: a rank ran twice"
        for r in recs:
            expected = sampler.local_indices(step, r["rank"], world).tolist()
            assert r["indices"] == expected, f"step {step}: wrong shard"
        if len(recs) < world:
            assert killed and last_of_gen[recs[0]["gen"]] == step, f"step {step}: partial"
        used = sorted(
            i for rank in range(world) for i in sampler.local_indices(step, rank, world).tolist()
        )
        assert used == sorted(sampler.global_indices(step).tolist()), f"step {step}: wrong samples"
        per_epoch.setdefault(sampler.epoch_of(step), []).extend(used)
    for epoch, used in per_epoch.items():
        assert len(used) == len(set(used)), f"epoch {epoch}: a sample seen twice"
        if (epoch + 1) * sampler.steps_per_epoch <= steps:
            assert len(used) == sampler.num_samples, f"epoch {epoch}: samples skipped"


def reference_model(
    args: dict[str, Any], batch_size: int, steps: int, dtype: torch.dtype = torch.float64
) -> dict[str, torch.Tensor]:
    """``mlp-digits`` trained in one process over the same global batches (no elasticity)."""
    from workers.catalog import validate_args
    from workers.workloads import prepare

    full = validate_args("mlp-digits", args)
    prepared = prepare("mlp-digits", full, torch.device("cpu"))
    sampler = ElasticSampler(prepared.num_samples, batch_size, prepared.seed)
    torch.set_num_threads(1)
    model, optimizer = prepared.model.to(dtype), prepared.optimizer
    for step in range(steps):
        idx = sampler.global_indices(step)
        optimizer.zero_grad()
        x, y = prepared.batch(idx)
        x = x.to(dtype)
        F.cross_entropy(model(x), y, reduction="sum").backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():
            assert p.grad is not None
            p.grad.div_(len(idx))
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest elementwise difference of two state dicts (on the CPU: either may be CUDA's)."""
    assert a.keys() == b.keys()
    return max(float((a[k].cpu().double() - b[k].cpu().double()).abs().max()) for k in a)


def cuda_layout(gpus: int, workers: int) -> tuple[str, str]:
    """(``JobRun.device``, ``--comm``) for ``workers`` workers at once on ``gpus`` GPUs.

    One GPU per worker: NCCL. Fewer: every worker on ``cuda:0``, gloo through
    the host (NCCL refuses two ranks of a communicator on one device).
    """
    if gpus < 1:
        raise SystemExit("--device cuda: this machine has no CUDA device")
    return ("cuda", "nccl") if gpus >= workers else ("cuda:0", "gloo")


def device_layout(device: str, workers: int) -> tuple[str, str]:
    """(``JobRun.device``, ``--comm``) of a benchmark's ``--device`` (``cpu`` or ``cuda``)."""
    if device == "cpu":
        return "cpu", "gloo"
    if device != "cuda":
        raise SystemExit("--device must be cpu or cuda")
    return cuda_layout(torch.cuda.device_count(), workers)


def check_devices(records: list[dict[str, Any]], device: str) -> list[str]:
    """The devices the workers' models were on (their step logs); SystemExit if not ``device``."""
    seen = sorted({str(r.get("device")) for r in records})
    if any(not d.startswith(device) for d in seen):
        raise SystemExit(f"the models were on {seen}, not on {device}")
    return seen
