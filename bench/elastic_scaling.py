"""Benchmark: stop-free scaling (this runtime) against stop-resume (torchrun's elastic launcher).

Same model in both (ResNet-18 on synthetic 16x16 images, global batch 20,
checkpoint every 10 mini-batches, gloo on the CPU, one process per slot):

* ours: 4 workers train; a 5th starts (scale-out 4->5), later leaves (scale-in
  5->4); then a slowed-down newcomer joins, is detected as a straggler and
  removed; then a worker is killed (SIGKILL; recovery 4->3, sync timeout 60 s);
  then ``profile(2, 3)``. The straggler's figures here are the runtime's own
  (``--drop-stragglers``): ``runtime_straggler_detect_s``, ``runtime_straggler_remove_s``.
* the straggler through the control plane, last (``--skip-control-plane`` leaves
  it out): ``bench/straggler_loop.py`` on the real stack (agents, Celery, the
  tick) — a worker slowed from outside, the runtime's report, the control
  plane's scale-in and the GPU freed: ``straggler_detect_s``,
  ``straggler_remove_s``.
* the physical limit of the scale-out pause, first: a plain gloo broadcast of
  the bytes the switch sends (ResNet-18 state + momentum) among 5 processes
  (``broadcast_limit_s``); the pause is reported as a ratio to it.
* torchrun ``--nnodes=4:5`` with the c10d rendezvous (tuned:
  ``last_call_timeout=1``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): a 5th
  agent joins, then is terminated; each change restarts every worker from the
  last checkpoint.

Pause of the existing workers = the mini-batch interval that contains the
switch minus the normal mini-batch time. Timings on a shared 2-core machine
are noisy. The last line is one JSON object.

    .venv/bin/python bench/elastic_scaling.py            # default, a few minutes
    .venv/bin/python bench/elastic_scaling.py --skip-torchrun
    .venv/bin/python bench/elastic_scaling.py --skip-torchrun --device cuda   # a GPU machine

``--device cuda``: the models and the communicated tensors on CUDA. With one
GPU per worker (6 or more GPUs) the workers use NCCL; with fewer, every
worker sits on ``cuda:0`` and the communicator is gloo through the host (NCCL
refuses two ranks of one communicator on one GPU). The plain broadcast of the
limit then runs the same way, and the JSON says which (``device``, ``comm``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARGS = {"steps": 100_000, "image_size": 16, "num_classes": 10, "lr": 0.01, "seed": 0}
BATCH = 20
CKPT_EVERY = 10
WORKERS_AT_ONCE = 6
"""The most workers the run has at one time (w0-w4 and the straggler w5), each a slot."""


def now() -> float:
    return time.time()


def say(line: str) -> None:
    """One line of the report on stdout, at once (the run takes minutes)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def ends(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return sorted((r["step"], r["t"]) for r in records)


def first_step_after(job: Any, t: float, generation: int, timeout: float) -> float:
    """When the first mini-batch of ``generation`` (or later) ended after ``t`` (any worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ends = [r["t"] for r in job.step_records_raw() if r["gen"] >= generation and r["t"] > t]
        if ends:
            return min(ends)
        time.sleep(0.1)
    raise TimeoutError(f"no mini-batch of generation {generation} within {timeout}s")


def phase_breakdown(times: dict[str, float], t0: float) -> dict[str, float]:
    """Seconds from ``t0`` to each start-up phase the worker reached (``workers.elastic.phases``)."""
    return {phase: round(t - t0, 3) for phase, t in sorted(times.items(), key=lambda kv: kv[1])}


def gap_pause(step_ends: list[tuple[int, float]], switch_step: int) -> tuple[float, float]:
    """(pause, batch time): the interval ending the first post-switch step minus the median."""
    times = dict(step_ends)
    before = [
        times[s] - times[s - 1]
        for s in range(switch_step - 6, switch_step)
        if s - 1 in times and s in times
    ]
    after = [
        times[s + 1] - times[s]
        for s in range(switch_step + 1, switch_step + 6)
        if s in times and s + 1 in times
    ]
    batch = statistics.median(before + after)
    interval = times[switch_step + 1] - times[switch_step]
    return max(0.0, interval - batch), batch


# -- ours --------------------------------------------------------------------------------------
def run_ours(
    redis_url: str, workdir: Path, profile_batches: int, device: str = "cpu"
) -> dict[str, Any]:
    from devtools.elastic import JobRun, check_devices, device_layout

    job_device, comm = device_layout(device, WORKERS_AT_ONCE)
    job = JobRun(
        redis_url,
        f"bench{os.getpid()}",
        workdir / "ours",
        workload="resnet18-synthetic",
        args=dict(ARGS),
        batch_size=BATCH,
        checkpoint_every=CKPT_EVERY,
        sync_timeout_s=60.0,
        extra=["--drop-stragglers"],
        device=job_device,
        comm=comm,
    )
    out: dict[str, Any] = {}
    try:
        job.start_initial(4)
        job.start_warm("w4")  # the agent's warm process for the idle slot (workers/agent/warm.py)
        job.wait_step(8, timeout=300)
        job.wait_warm("w4")
        latest = max(r["step"] for r in job.step_records_raw())
        job.wait_step(latest + 3, timeout=120)  # the warm-up's CPU load is over
        t_start = now()
        job.assign("w4")
        grown = job.wait_event("scale_done", 300)
        first = job.wait_event("progress", 120, lambda e: e["world"] == 5)
        del first
        job.wait_step(grown["step"] + 8, timeout=120)
        records = job.step_records_raw()
        pauses = []
        for w in ("w0", "w1", "w2", "w3"):
            pause, batch = gap_pause(
                ends([r for r in records if r["worker"] == w]), grown["step"] - 1
            )
            pauses.append((pause, batch))
        newcomer_first = min(r["t"] for r in records if r["worker"] == "w4")
        out["scale_out_pause_s"] = max(p for p, _ in pauses)
        out["scale_out_switch_s"] = max(
            float(v)
            for v in job.control.redis.hgetall(
                job.control.keys.pauses(grown["generation"])
            ).values()
        )
        profiles = job.control.redis.hgetall(job.control.keys.switch_profile(grown["generation"]))
        out["scale_out_switch_parts_s"] = {
            (k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in profiles.items()
        }
        out["newcomer_ready_s"] = newcomer_first - t_start
        out["newcomer_phases_s"] = phase_breakdown(job.phases("w4"), t_start)
        out["batch_time_s"] = statistics.median(b for _, b in pauses)
        say(f"ours scale-out 4->5: pause {out['scale_out_pause_s']:.3f}s "
              f"(switch+broadcast {out['scale_out_switch_s']:.3f}s), batch {out['batch_time_s']:.3f}s, "
              f"newcomer (warm) end-to-end {out['newcomer_ready_s']:.1f}s")  # fmt: skip
        say(f"  switch parts (s) per member: {out['scale_out_switch_parts_s']}")
        say(f"  warm newcomer's phases after the assignment: {out['newcomer_phases_s']}")

        job.control.request_scale_in(["w4"], "bench")
        shrunk = job.wait_event("scale_done", 120)
        job.wait_step(shrunk["step"] + 8, timeout=120)
        records = job.step_records_raw()
        pauses = [
            gap_pause(ends([r for r in records if r["worker"] == w]), shrunk["step"] - 1)
            for w in ("w0", "w1", "w2", "w3")
        ]
        out["scale_in_pause_s"] = max(p for p, _ in pauses)
        out["scale_in_batch_time_s"] = statistics.median(b for _, b in pauses)
        out["scale_in_switch_s"] = max(
            float(v)
            for v in job.control.redis.hgetall(
                job.control.keys.pauses(shrunk["generation"])
            ).values()
        )
        say(f"ours scale-in 5->4: pause {out['scale_in_pause_s']:.3f}s "
              f"(switch {out['scale_in_switch_s']:.3f}s, batch {out['scale_in_batch_time_s']:.3f}s)")  # fmt: skip

        slow_ms = int(1000 * out["batch_time_s"] / 2)
        t_cold = now()
        job.start("w5", extra=["--slow-ms", str(slow_ms)])  # a cold newcomer (no warm process)
        joined = job.wait_event("scale_done", 300)
        t_joined = now()
        straggler = job.wait_event("straggler", 300)
        t_detected = now()
        removed = job.wait_event("scale_done", 300, lambda e: "w5" in e["leavers"])
        t_removed = now()
        del joined, straggler
        cold = phase_breakdown(job.phases("w5"), t_cold)  # all written: it trained since
        out["newcomer_cold_phases_s"] = cold
        out["newcomer_cold_ready_s"] = cold.get("state_loaded")
        say(f"  cold newcomer's phases after its start (+{slow_ms} ms a batch): {cold}")
        out["runtime_straggler_detect_s"] = t_detected - t_joined
        out["runtime_straggler_remove_s"] = t_removed - t_detected
        say(f"ours straggler (+{slow_ms} ms/batch): detected "
              f"{out['runtime_straggler_detect_s']:.1f}s after joining, removed "
              f"{out['runtime_straggler_remove_s']:.1f}s later")  # fmt: skip

        # SIGKILL of a worker (not the leader): time to the first mini-batch after recovery
        job.wait_step(removed["step"] + 5, timeout=120)
        status = job.control.status()
        victim = [w for w in status.members if w != status.leader][-1]
        earlier = [e for _id, e in job.events if e["kind"] in ("worker_failed", "recovered")]
        if earlier:
            say(f"note: failures before the kill: {earlier}")
        t_kill = now()
        job.kill(victim)
        recovered = job.wait_event("recovered", 120, lambda e: victim in e["dead"])
        t_first = first_step_after(job, t_kill, recovered["generation"], 120)
        out["failure_recover_s"] = t_first - t_kill
        say(f"ours SIGKILL of {victim} ({status.members}): first mini-batch after recovery "
              f"{out['failure_recover_s']:.1f}s later (sync timeout 60 s)")  # fmt: skip

        t0 = now()
        job.control.request_profile(2, 3, batches_per_level=profile_batches)
        profile = job.wait_event("profile_done", 600)
        out["profile_s"] = now() - t0
        out["profile_curve"] = profile["curve"]
        say(f"ours profile(2, 3), {profile_batches} batches a level: {out['profile_s']:.1f}s, "
              f"curve {profile['curve']}")  # fmt: skip
        job.stop_and_wait(120)
        out["device"], out["comm"] = job_device, comm
        out["model_devices"] = check_devices(job.step_records_raw(), device)
    finally:
        job.terminate()
        job.control.cleanup()
    return out


# -- the physical limit of the scale-out pause ------------------------------------------------
BROADCAST_REPEATS = 3


def state_bytes() -> int:
    """Bytes the scale-out sends: ResNet-18's state (parameters, buffers) and its momentum."""
    from workers.workloads.resnet_synthetic import ResNet18

    model = ResNet18(ARGS["num_classes"])
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    momentum = sum(p.numel() * p.element_size() for p in model.parameters())
    return state + momentum


def broadcast_worker(spec: str) -> None:
    """One process of the plain broadcast (``RANK,WORLD,PORT,NBYTES,DEVICE,COMM,OUT``).

    Rank 0 writes the times. ``DEVICE`` as ``JobRun.device`` (``cuda``: rank
    ``r`` on GPU ``r``), ``COMM`` ``gloo`` or ``nccl``: the run's own layout.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank_s, world_s, port_s, nbytes_s, device_s, comm, out = spec.split(",", 6)
    rank, world, nbytes = int(rank_s), int(world_s), int(nbytes_s)
    device = torch.device(f"cuda:{rank}" if device_s == "cuda" else device_s)
    torch.set_num_threads(1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore(
        "127.0.0.1", int(port_s), world, rank == 0, timeout=timedelta(seconds=120)
    )
    group: Any
    if comm == "nccl":
        group = dist.ProcessGroupNCCL(store, rank, world)
    else:
        group = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=120))
    buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    token = torch.zeros(1, device=device)
    times = []
    for _ in range(BROADCAST_REPEATS + 1):  # the first one warms the connections up
        group.allreduce([token]).wait()
        t0 = time.perf_counter()
        group.broadcast(buffer, 0).wait()
        group.allreduce([token]).wait()  # every member has the bytes
        float(token.sum())  # the host waits for the device (NCCL's wait does not block it)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times[1:]))


def broadcast_limit(world: int, nbytes: int, workdir: Path, device: str = "cpu") -> float:
    """Median seconds of a plain gloo broadcast of ``nbytes`` among ``world`` processes.

    The scale-out's switch sends the same bytes among the same number of
    processes on the same machine (one per slot, one thread each): its pause
    cannot be shorter than this.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from devtools.elastic import device_layout

    out = workdir / "broadcast.json"
    job_device, comm = device_layout(device, WORKERS_AT_ONCE)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    script = str(Path(__file__).resolve())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                script,
                "--broadcast-worker",
                f"{rank},{world},{port},{nbytes},{job_device},{comm},{out}",
            ],
            env=env,
            cwd=REPO,
        )
        for rank in range(world)
    ]
    for proc in procs:
        if proc.wait(timeout=300) != 0:
            raise RuntimeError("the plain broadcast failed")
    return statistics.median(json.loads(out.read_text()))


# -- NCCL on this machine (bench/device_check.sh) ---------------------------------------------
def nccl_smoke() -> dict[str, Any]:
    """The runtime's NCCL calls on this machine's GPUs (one rank per GPU, at most two).

    ``comm.build_group`` with NCCL, the build's ``warm_up``, a gradient-style
    all-reduce, the generation-0 ``broadcast_state``, and (two GPUs) the
    scale-out's ``send_state``/``receive_state``: each rank a thread of this
    process on its own device. With one GPU the point-to-point part cannot
    run (NCCL has no send to oneself); the JSON says so.
    """
    import threading

    import torch

    # torch.distributed re-exports it from here; its stub does not say so.
    from torch._C._distributed_c10d import HashStore

    from workers.elastic import comm

    world = min(2, torch.cuda.device_count())
    if world < 1:
        raise SystemExit("--nccl-smoke: this machine has no CUDA device")
    store = HashStore()
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
        t0 = time.perf_counter()
        group = comm.build_group(store, 0, rank, world, device, 60.0, "nccl")
        comm.warm_up(group, rank, 0, [1] if world == 2 else [], device)
        built = time.perf_counter() - t0
        grads = torch.full((1 << 20,), float(rank + 1), device=device)
        comm.allreduce_sum(group, grads)
        summed = float(grads[0])
        state = {"w": torch.arange(8.0, device=device) * (rank + 1), "step": 3}
        got = comm.broadcast_state(group, state if rank == 0 else None, 0, device)
        out: dict[str, Any] = {
            "built_s": round(built, 3),
            "allreduce_ok": summed == world * (world + 1) / 2,
            "broadcast_ok": bool(torch.equal(got["w"].cpu(), torch.arange(8.0))),
            "broadcast_device": str(got["w"].device),
        }
        if world == 2:
            if rank == 0:
                comm.send_state(group, state, [1])
            else:
                sent = comm.receive_state(group, 0, device, timeout_s=60)
                out["p2p_ok"] = bool(torch.equal(sent["w"].cpu(), torch.arange(8.0)))
                out["p2p_device"] = str(sent["w"].device)
        torch.cuda.synchronize(device)
        results[rank] = out

    def guarded(rank: int) -> None:
        try:
            rank_main(rank)
        except Exception as exc:  # reported in the JSON, which the script keeps
            results[rank] = {"error": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return {
        "gpus": torch.cuda.device_count(),
        "ranks": world,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "p2p": "tested" if world == 2 else "not possible with one GPU",
        "per_rank": results,
    }


# -- torchrun --------------------------------------------------------------------------------
def torchrun_worker(workdir: Path, max_steps: int) -> None:
    """The stop-resume baseline's training script (run by torchrun on every node)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from workers.elastic import checkpoint
    from workers.workloads.resnet_synthetic import ResNet18

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = ResNet18(10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = checkpoint.load_latest(str(workdir / "ckpt"), "torchrun")
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    ddp = DistributedDataParallel(model)
    pool = torch.randn(256, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    log = open(workdir / f"tr-{restart}-{rank}.jsonl", "a")  # noqa: SIM115
    log.write(json.dumps({"event": "start", "t": now(), "step": step, "world": world}) + "\n")
    log.flush()
    while step < max_steps and not (workdir / "stop").exists():
        idx = torch.arange(step * BATCH, (step + 1) * BATCH)[rank::world]
        optimizer.zero_grad()
        F.cross_entropy(ddp(pool[idx % 256]), idx % 10).backward()
        optimizer.step()
        step += 1
        log.write(json.dumps({"event": "step", "t": now(), "step": step, "world": world}) + "\n")
        log.flush()
        if rank == 0 and step % CKPT_EVERY == 0:
            checkpoint.save(
                str(workdir / "ckpt"),
                "torchrun",
                step,
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
            )
    dist.destroy_process_group()


def torchrun_timeline(workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for path in workdir.glob("tr-*-0.jsonl"):
        for line in path.read_text().splitlines():
            rows.append(json.loads(line))
    return sorted(rows, key=lambda r: r["t"])


def torchrun_pause(
    rows: list[dict[str, Any]], t_change: float, new_world: int
) -> tuple[float, float, int]:
    """(pause, batch time, redone steps) around a membership change at ``t_change``."""
    steps = [r for r in rows if r["event"] == "step" and r["t"] >= t_change - 120]
    first_new = next(
        i for i, r in enumerate(steps) if r["world"] == new_world and r["t"] > t_change
    )
    old, new = steps[:first_new], steps[first_new:]
    last_old = old[-1]
    before = [b["t"] - a["t"] for a, b in itertools.pairwise(old) if b["step"] == a["step"] + 1][
        -8:
    ]
    after = [b["t"] - a["t"] for a, b in itertools.pairwise(new) if b["step"] == a["step"] + 1][:8]
    batch = statistics.median(before + after)
    pause = new[0]["t"] - last_old["t"] - batch
    return max(0.0, pause), batch, last_old["step"] - new[0]["step"] + 1


def run_torchrun(workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=4:5", "--nproc_per_node=1",
        "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench",
        "--rdzv_conf=last_call_timeout=1", "--max_restarts=10", "--monitor_interval=0.5",
        str(Path(__file__).resolve()), "--torchrun-worker", str(workdir),
    ]  # fmt: skip
    agents: list[subprocess.Popen[bytes]] = []

    def start_agent(i: int) -> None:
        out = open(workdir / f"agent{i}.out", "ab")  # noqa: SIM115
        agents.append(
            subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        time.sleep(0.2 if i == 0 else 0)

    def wait_for(pred: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred(torchrun_timeline(workdir)):
            if time.monotonic() > deadline:
                raise TimeoutError("torchrun baseline did not progress")
            time.sleep(0.5)

    out: dict[str, Any] = {}
    try:
        for i in range(4):
            start_agent(i)
        wait_for(lambda rows: sum(r["event"] == "step" for r in rows) >= 14, 600)
        t_out = now()
        start_agent(4)
        wait_for(lambda rows: sum(r["event"] == "step" and r["world"] == 5 for r in rows) >= 8, 600)
        rows = torchrun_timeline(workdir)
        pause, batch, redone = torchrun_pause(rows, t_out, 5)
        out.update(
            stop_resume_pause_s=pause,
            stop_resume_batch_time_s=batch,
            stop_resume_redone_steps=redone,
        )
        say(
            f"torchrun scale-out 4->5: pause {pause:.1f}s (batch {batch:.3f}s, {redone} steps redone)"
        )

        t_in = now()
        os.killpg(agents[4].pid, signal.SIGTERM)
        wait_for(
            lambda rows: (
                sum(r["event"] == "step" and r["world"] == 4 and r["t"] > t_in for r in rows) >= 8
            ),
            600,
        )
        rows = torchrun_timeline(workdir)
        pause_in, _, redone_in = torchrun_pause([r for r in rows if r["t"] > t_out], t_in, 4)
        out.update(
            stop_resume_scale_in_pause_s=pause_in, stop_resume_scale_in_redone_steps=redone_in
        )
        say(f"torchrun scale-in 5->4: pause {pause_in:.1f}s ({redone_in} steps redone)")
    finally:
        (workdir / "stop").touch()
        for agent in agents:
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
    return out


def control_plane_figures(redis_db: int) -> dict[str, Any]:
    """The straggler removed by the control plane, on the real stack (``bench/straggler_loop.py``).

    The runtime's own ``--drop-stragglers`` figures above are ``runtime_straggler_*``;
    these are the issue's ``straggler_detect_s`` (slowdown start → the control plane
    hears of it) and ``straggler_remove_s`` (→ the worker's GPU freed in the database).
    """
    from bench.straggler_loop import control_plane_straggler

    loop = control_plane_straggler(redis_db=redis_db)
    say(f"control plane: straggler detected {loop['straggler_detect_s']:.2f}s after the "
        f"slowdown, its GPU freed {loop['straggler_remove_s']:.2f}s later "
        f"(load {loop['load_avg']})")  # fmt: skip
    return {
        "straggler_detect_s": loop["straggler_detect_s"],
        "straggler_remove_s": loop["straggler_remove_s"],
        "control_plane_straggler": loop,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchrun-worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--broadcast-worker", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--skip-torchrun", action="store_true", help="measure only this runtime")
    parser.add_argument(
        "--nccl-smoke", action="store_true", help="only check the runtime's NCCL calls (GPU)"
    )
    parser.add_argument(
        "--profile-batches", type=int, default=4, help="mini-batches a profile level"
    )
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="where the models train"
    )
    parser.add_argument(
        "--skip-control-plane",
        action="store_true",
        help="skip the straggler loop through the real stack (bench/straggler_loop.py)",
    )
    parser.add_argument(
        "--stack-redis-db", type=int, default=9, help="Redis db of that stack (emptied first)"
    )
    args = parser.parse_args()
    if args.torchrun_worker:
        torchrun_worker(Path(args.torchrun_worker), 100_000)
        return 0
    if args.broadcast_worker:
        broadcast_worker(args.broadcast_worker)
        return 0
    if args.nccl_smoke:
        smoke = nccl_smoke()
        say(json.dumps(smoke))
        failed = [r for r in smoke["per_rank"] if not r or "error" in r]
        return 1 if failed else 0
    from utilities.embedded_redis import ensure_running

    with tempfile.TemporaryDirectory(prefix="edl-bench-") as tmp:
        workdir = Path(tmp)
        redis_url = os.environ.get("REDIS_URL") or ensure_running(workdir)
        nbytes = state_bytes()
        say(f"load average {os.getloadavg()} at the start")
        limit = broadcast_limit(5, nbytes, workdir, args.device)
        say(f"plain broadcast of {nbytes / 1e6:.0f} MB among 5 processes: {limit:.3f}s")
        result = run_ours(redis_url, workdir, args.profile_batches, args.device)
        result["broadcast_bytes"] = nbytes
        result["broadcast_limit_s"] = limit
        result["scale_out_pause_over_broadcast"] = result["scale_out_pause_s"] / limit
        say(f"scale-out pause / plain broadcast = {result['scale_out_pause_over_broadcast']:.2f}x "
              f"(target <= 1.5x)")  # fmt: skip
        if not args.skip_torchrun:
            result.update(run_torchrun(workdir / "torchrun"))
    if not args.skip_control_plane and args.device == "cpu":
        result.update(control_plane_figures(args.stack_redis_db))
    if "stop_resume_pause_s" in result:
        ratio = result["scale_out_pause_s"] / result["stop_resume_pause_s"]
        result["scale_out_pause_ratio"] = ratio
        # stop-resume profiling: one restart per level plus the same measuring batches
        levels = 2
        result["stop_resume_profile_s_est"] = levels * (
            result["stop_resume_pause_s"]
            + (args.profile_batches + 2) * result["stop_resume_batch_time_s"]
        )
        result["profile_ratio_est"] = result["profile_s"] / result["stop_resume_profile_s_est"]
        say(f"scale-out pause: ours / stop-resume = {ratio:.3%} (target <= 5%)")
        say(f"profile(2, 3): ours {result['profile_s']:.1f}s vs stop-resume est. "
              f"{result['stop_resume_profile_s_est']:.1f}s ({result['profile_ratio_est']:.0%})")  # fmt: skip
    say(f"scale-in pause {result['scale_in_pause_s']:.3f}s vs batch {result['batch_time_s']:.3f}s "
          f"(target: within one batch)")  # fmt: skip
    result["load_average_end"] = os.getloadavg()
    say(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
