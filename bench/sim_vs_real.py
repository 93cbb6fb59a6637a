"""The simulator against the real cluster: one trace, run live and simulated, job by job.

    python bench/sim_vs_real.py --redis-db 5 --save run.json   # the 20-job trace (~8 minutes)
    python bench/sim_vs_real.py --jobs 6                       # its first 6 jobs (development)
    python bench/sim_vs_real.py --replay run.json              # the simulated half of a saved run
    python bench/sim_vs_real.py --replay run.json --ablation   # ... and each cost model part alone
    python bench/sim_vs_real.py --replay run.json --timeline   # ... where the two runs part, job by job
    python bench/sim_vs_real.py --replay run.json --runtimes   # ... run times each side, the law's check
    python bench/sim_vs_real.py --write-trace   # regenerate bench/sim_vs_real_trace.json (seeded)

Real run: ``manage.py runstack`` exactly as ``tests/test_e2e.py`` starts it (a
fresh PostgreSQL database on ``DATABASE_URL``'s server, ``REDIS_URL``'s server
with db ``--redis-db``, TICK_SECONDS=1, OMP_NUM_THREADS=1, the 8-slot demo
fabric: 2 leaves x 2 servers x 2 slots), a tenant and a token, each job
submitted through the REST API at its arrival time; then every job's
submitted/started/finished times, its scaling events and its progress reports
(``/jobs/{id}/metrics/``: step, time, parallelism).  The Redis db must be this
run's alone: a second stack on it shares the jobs' keys (same names) and the
agents' forwarding claims, and steals or corrupts reports; the run marks the
db and says ``"clean": false`` when the mark was touched.

Simulated run: :func:`scheduler.simulator.simulate` on 8 GPUs, 2 per server,
vClos placement on the same fabric (the live tick binds through
``scheduler.binding`` too), a 1 s tick, the same policy with the live
parameters (EDL's quanta 500/10,000 GPU·s, N = 10, r = 0.5, class ageing 24 h),
each job's work in steps and, from what the run measured
(:mod:`devtools.measured`): its steps/s at each size on a core of its own, the
CPU-sharing law of the run (8 slots on 2 cores: ``SimConfig.slot_slowdown``),
the start-up of each workload (start to first step), the end of a job (last
step to its recorded end), and a scale-out's join time and switch pause
(``ScalingCost``).  Every figure is a median or a fit over the run's records,
never a fit to its JCTs.

And the live control plane's own rules (``Model``; each off in ``--ablation``):
each job's own start-up and end as measured (as its rates are), the control
plane's delays (an arrival seen ``arrival_s`` late; an ended job's GPUs
handed over ``release_s`` after its recorded end: medians over the run's
events, ``devtools.measured.arrival_delays`` and ``handover_delays``), the
policy ranking a job's sizes by the samples/s it reported (the live curve,
``live_curve``) rather than the free-core rates its progress follows, and a
fresh policy core every pass, as the live tick builds one from its snapshot
(``TickCore``), the GPUs the run marked suspect (a straggler report: out of
service for the cool-down, ``Outage``), and the live tick's rules where the
simulator's own differ (``scheduler.sim_config.LIVE_TICK``: one binding round
per tick, a job about to end or switching shown to the policy at its size, the
leavers' slots busy until they are gone).

Each saved run records the live binder it was made with (``_meta.binder``, a
name of ``scheduler.sim_config.BINDERS``), and its replay binds as that binder
placed shrinks (``run_binder``).  An elastic start whose extras fit no shape
starts on its base size in the comparison, as the live binder does since
2026-12-03 21:52, even for a run made before, whose binder refused it whole
(``Model.whole``: an ``--ablation`` row).

Output: a job-by-job table (JCT real vs simulated) and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_client import ApiClient  # noqa: E402
from devtools.measured import (  # noqa: E402
    BusySlots,
    CpuFit,
    MeasuredJob,
    MeasuredPolicy,
    Progress,
    arrival_delays,
    finish_delay,
    first_step_at,
    fit_shared_cpu,
    fit_start_law,
    handover_delays,
    implied_external,
    law_by_busy,
    live_curve,
    median_or,
    pooled_rates,
    step_rates,
    step_totals,
)
from scheduler.policies.base import Plan, Policy, PolicyCore  # noqa: E402
from scheduler.sim_config import (  # noqa: E402
    BASE_THEN_EXTRAS,
    BINDERS,
    BindingRounds,
    EndingJobs,
    Fidelity,
    LeaversSlots,
    StartBinder,
    StartUpScaleIn,
    SwitchingJobs,
    binder_named,
)

log = logging.getLogger("sim_vs_real")
TRACE = ROOT / "bench" / "sim_vs_real_trace.json"
TARGET_AVG, TARGET_JOB = 0.10, 0.25
GPUS, GPUS_PER_SERVER = 8, 2
TICK_S = 1.0  # the stack's TICK_SECONDS and the simulator's tick
SCALE_OUT_MIN_SECONDS_LEFT = 30.0  # the stack's default (README): no growth this near the end
DRIFT_BIN_S = 60.0  # the other load the rates imply, per minute of the run (the residual)
# portal.demo.DEMO_FABRIC (not imported: that module needs Django's settings)
DEMO_FABRIC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
ENDED = ("completed", "failed", "cancelled")
META = "_meta"  # the saved run's key for what is not a job (cores, load, clean)
# Work per second of a job at its request on this 2-core machine while the 8 slots are
# busy (measured by a --jobs 6 run at load average 30), used only to size the trace;
# the comparison uses what the run itself measured.
EPOCHS_PER_S = 0.6  # mlp-digits (29 steps an epoch), about 20 steps/s
STEPS_PER_S = 0.8  # resnet18-synthetic on 8x8 images
# The stack's agents miss heartbeats on a loaded machine; a server declared down requeues
# its jobs, which no simulator run of this trace models.  Give them two minutes.
AGENT_DOWN_AFTER_S = "120"
MARK_KEY = "bench:sim_vs_real:owner"
# The live binder a run made now is bound by (recorded in its _meta, read by run_binder).
LIVE_BINDER = BASE_THEN_EXTRAS


# ----------------------------------------------------------------------------- the trace


def make_trace(seed: int = 17, jobs: int = 20) -> list[dict[str, Any]]:
    """A seeded mix: 1-4 GPUs (half elastic), short and long, both workloads, ~3 minutes of arrivals."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    at = 0.0
    for i in range(jobs):
        gpus = rng.choice((1, 1, 2, 2, 2, 3, 4))
        long = rng.random() < 0.3
        seconds = rng.uniform(90, 150) if long else rng.uniform(20, 50)
        elastic = rng.random() < 0.5
        min_gpus = max(1, gpus // 2) if elastic else gpus
        max_gpus = min(4, gpus * 2) if elastic else gpus
        if rng.random() < 0.6:
            workload = "mlp-digits"
            args: dict[str, Any] = {"epochs": max(1, round(seconds * EPOCHS_PER_S))}
        else:
            workload = "resnet18-synthetic"
            args = {"steps": max(1, round(seconds * STEPS_PER_S)), "image_size": 8}
        out.append(
            {
                "name": f"j{i:02d}",
                "at": round(at, 1),
                "workload": workload,
                "gpus": gpus,
                "min_gpus": min_gpus,
                "max_gpus": max_gpus,
                "args": {**args, "seed": i},
            }
        )
        at += rng.expovariate(1 / 8.0)
    return out


# ----------------------------------------------------------------------------- the real run


def ts(value: str | None) -> float | None:
    """An API timestamp as epoch seconds."""
    return datetime.fromisoformat(value).timestamp() if value else None


def run_real(trace: list[dict[str, Any]], policy: str, redis_db: int) -> dict[str, Any]:
    """Run ``trace`` on a fresh stack; every job's record (times, events, progress) and ``_meta``."""
    import redis

    from devtools.stack import stack_env, start_stack, stop_stack, wait_http
    from utilities.embedded_redis import free_port

    tmp = Path(tempfile.mkdtemp(prefix="simreal-"))
    # DEBUG is off in the stack (as in the e2e tests): it needs a key, a throwaway one here.
    key = os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50)
    env, drop_db = stack_env(
        tmp,
        redis_db=redis_db,
        SCHEDULER_POLICY=policy,
        SECRET_KEY=key,
        AGENT_DOWN_AFTER_SECONDS=AGENT_DOWN_AFTER_S,
    )
    # The db was just emptied: mark it ours, to see at the end whether anyone else used it.
    store = redis.Redis.from_url(env["REDIS_URL"]) if env.get("REDIS_URL") else None
    mark = secrets.token_hex(8)
    if store is not None:
        store.set(MARK_KEY, mark)
    port = free_port()
    proc = start_stack(tmp, port, env)
    loads: list[list[float]] = []
    began = datetime.now(UTC).isoformat(timespec="seconds")
    done = threading.Event()
    sampler = threading.Thread(target=sample_load, args=(loads, done), daemon=True)
    sampler.start()
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
        client = ApiClient(f"http://127.0.0.1:{port}", token, timeout_s=120)
        ids = submit_all(client, trace)
        records = collect(client, ids, trace)
    finally:
        done.set()
        stop_stack(proc, tmp)
        drop_db()
    clean = store is None or store.get(MARK_KEY) == mark.encode()
    if not clean:
        log.error("redis db %d was emptied or used by someone else during the run", redis_db)
    records[META] = {
        "began": began,
        "binder": LIVE_BINDER.name,
        "cores": os.cpu_count() or 1,
        "load": loads,
        "clean": clean,
        "stack_log": str(tmp / "stack.log"),
    }
    return records


def sample_load(loads: list[list[float]], done: threading.Event) -> None:
    """The machine's load averages (1, 5, 15 min) every 5 s until ``done``: the run's load."""
    while not done.wait(5.0):
        loads.append([round(x, 2) for x in os.getloadavg()])


def submit_all(client: ApiClient, trace: list[dict[str, Any]]) -> dict[str, int]:
    """Submit each job at its arrival time (seconds after the first); job ids by name."""
    origin = time.monotonic()
    ids: dict[str, int] = {}
    for job in trace:
        delay = origin + job["at"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = {k: job[k] for k in ("name", "workload", "gpus", "min_gpus", "max_gpus", "args")}
        ids[job["name"]] = int(client.call("/api/v1/jobs/", body)["id"])
        log.info(
            "t=%6.1f submitted %s (%s)", time.monotonic() - origin, job["name"], ids[job["name"]]
        )
    deadline = time.monotonic() + 18 * 60
    while time.monotonic() < deadline:
        states = [client.call(f"/api/v1/jobs/{i}/")["state"] for i in ids.values()]
        if all(s in ENDED for s in states):
            return ids
        time.sleep(3.0)  # polling the API for the end, not standing in for work
    raise TimeoutError("the jobs did not all end within 18 minutes")


def collect(client: ApiClient, ids: dict[str, int], trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Each job's times, events and progress reports."""
    out: dict[str, Any] = {}
    for job in trace:
        pk = ids[job["name"]]
        detail = client.call(f"/api/v1/jobs/{pk}/")
        history = client.call(f"/api/v1/jobs/{pk}/events/?page_size=200")["results"]
        progress: list[dict[str, Any]] = []
        query = ""
        while True:
            page = client.call(f"/api/v1/jobs/{pk}/metrics/{query}")["progress"]
            progress += page
            if len(page) < 5000:
                break
            query = f"?since_step={page[-1]['step']}"
        out[job["name"]] = {"detail": detail, "events": history, "progress": progress}
    return out


# ----------------------------------------------------------------------------- the measurement

RESIZE = re.compile(r"^(scale out|scale in|switching) (\d+)→(\d+)")
PAUSED = re.compile(r"paused ([0-9.]+) s")


@dataclass(frozen=True)
class Switch:
    """One communicator switch of the real run: what was asked, how long until done."""

    job: str
    old: int
    new: int
    decided: float
    done: float  # "switch done"
    pause_s: float | None  # the existing workers' pause, as the runtime reported it


def slot_changes(events: list[dict[str, Any]]) -> tuple[list[tuple[float, int]], list[Switch]]:
    """A job's busy-slot changes (time, +/- slots) and its switches, from its events.

    A slot is busy while a process of the job runs on it: from the placement,
    from a scale-out's decision (the newcomer starts then), until a scale-in's
    switch is done (the leavers train until then), until the job ends.
    """
    changes: list[tuple[float, int]] = []
    switches: list[Switch] = []
    held = 0
    leaving = 0
    asked: tuple[float, int, int] | None = None
    for event in sorted(events, key=lambda e: (e["at"], e["id"])):
        at = ts(event["at"]) or 0.0
        reason = event["reason"]
        if event["kind"] == "state" and (event["from_state"], event["to_state"]) == (
            "queued",
            "running",
        ):
            held = int(event["to_parallelism"] or 0)
            changes.append((at, held))
            continue
        resize = RESIZE.match(reason)
        if event["kind"] == "state" and resize and event["to_state"] == "scaling":
            old, new = int(resize.group(2)), int(resize.group(3))
            asked = (at, old, new)
            if new > old:
                changes.append((at, new - old))
                held = new
            else:
                leaving = old - new
        elif reason.startswith("switch done") and asked is not None:
            paused = PAUSED.search(reason)
            pause = float(paused[1]) if paused else None
            switches.append(Switch("", asked[1], asked[2], asked[0], at, pause))
            if leaving:
                changes.append((at, -leaving))
                held -= leaving
                leaving = 0
            asked = None
        elif event["to_state"] in ENDED or event["kind"] == "preempted":
            if held:
                changes.append((at, -held - leaving))
            held = leaving = 0
            asked = None
    return changes, switches


def measure(trace: list[dict[str, Any]], real: dict[str, Any]) -> dict[str, Any]:
    """Per job: JCT, steps, rates, start-up and end; the run's sharing law and switches."""
    meta = real.get(META, {})
    cores = float(meta.get("cores") or os.cpu_count() or 1)
    samples: dict[str, list[Progress]] = {}
    changes: list[tuple[float, int]] = []
    switches: list[Switch] = []
    for job in trace:
        rec = real[job["name"]]
        samples[job["name"]] = [
            Progress(ts(p["at"]) or 0.0, int(p["step"]), int(p["parallelism"]))
            for p in rec["progress"]
        ]
        mine, switched = slot_changes(rec["events"])
        changes += mine
        switches += [replace(s, job=job["name"]) for s in switched]
    busy = BusySlots(changes)
    fit = fit_shared_cpu(samples, busy, cores)
    jobs: dict[str, Any] = {}
    starts: list[tuple[str, float, float]] = []
    for job in trace:
        name = job["name"]
        detail = real[name]["detail"]
        submitted, started, finished = (
            ts(detail["submitted_at"]), ts(detail["started_at"]), ts(detail["finished_at"])
        )  # fmt: skip
        mine = samples[name]
        wall = step_rates(mine)
        steps = max([int(detail.get("step") or 0), *(s.step for s in mine)])
        began = first_step_at(mine, wall)
        if started and began is not None and detail["state"] == "completed":
            starts.append((job["workload"], started, began))
        jobs[name] = {
            "workload": job["workload"],
            "state": detail["state"],
            "submit": submitted,
            "start": started,
            "end": finished,
            "jct": detail["jct_seconds"],
            "steps": steps,
            "rates": wall,
            "free_rates": step_rates(mine, busy, fit.cpu),
            "free_totals": step_totals(mine, busy, fit.cpu),
            "wall_totals": step_totals(mine),
            "startup": began - started if started and began is not None else None,
            "first_step": began,
            "finish": finish_delay(finished, steps, mine, wall) if finished else None,
            "sizes": sorted({s.parallelism for s in mine}),
            "seen": live_curve(
                (int(p["parallelism"]), float(p["samples_per_s"] or 0.0))
                for p in sorted(real[name]["progress"], key=lambda p: ts(p["at"]) or 0.0)
            ),
            "reports": len(mine),
        }
    start_fit = fit_start_law(starts, busy, cores)
    handovers, arrivals = control_delays(trace, real, jobs)
    suspects = suspect_marks(trace, real)
    drift = implied_external(
        samples, {name: j["free_rates"] for name, j in jobs.items()}, busy, cores, DRIFT_BIN_S
    )
    for got in jobs.values():
        got["free_startup"] = (
            busy.free_seconds(got["start"], got["first_step"], start_fit.cpu)
            if got["startup"] is not None
            else None
        )
    return {
        "jobs": jobs,
        "switches": switches,
        "fit": fit,
        "start_fit": start_fit,
        "drift": drift,
        "meta": meta,
        "handovers": handovers,
        "arrivals": arrivals,
        "suspects": suspects,
        "busy": busy,
        "samples": samples,
    }


def suspect_marks(trace: list[dict[str, Any]], real: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs the live control plane marked suspect (a straggler report), as the run recorded.

    Each: when (epoch seconds), until when, the GPU, and the job that kept it
    ("" when the straggler moved off it or was removed: the GPU was free at once).
    """
    out: list[dict[str, Any]] = []
    for job in trace:
        for event in real[job["name"]]["events"]:
            data = event.get("data") or {}
            if event["kind"] != "straggler" or not data.get("suspect_until"):
                continue
            out.append(
                {
                    "at": ts(event["at"]) or 0.0,
                    "until": ts(data["suspect_until"]) or 0.0,
                    "gpu": int(data.get("gpu", -1)),
                    "holder": job["name"] if data.get("action") == "kept" else "",
                }
            )
    return out


def control_delays(
    trace: list[dict[str, Any]], real: dict[str, Any], jobs: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """The live control plane's delays: an end's handover to the next placement, and an
    arrival's wait for a placement when room was free (:mod:`devtools.measured`)."""
    placements: list[tuple[float, float]] = []
    for job in trace:
        got = jobs[job["name"]]
        for event in real[job["name"]]["events"]:
            resize = RESIZE.match(event["reason"])
            placed = (event["from_state"], event["to_state"]) == ("queued", "running")
            grown = resize and event["to_state"] == "scaling" and int(resize[3]) > int(resize[2])
            if event["kind"] == "state" and (placed or grown):
                placements.append((ts(event["at"]) or 0.0, got["submit"]))
    ends = [j["end"] for j in jobs.values() if j["end"] is not None]
    handovers = handover_delays(ends, placements)
    arrivals = arrival_delays(
        [(j["submit"], j["start"]) for j in jobs.values() if j["start"] is not None], ends
    )
    return handovers, arrivals


# ----------------------------------------------------------------------------- the simulation


@dataclass(frozen=True)
class Model:
    """Which parts of the cost model a simulation uses (all on: the comparison; --ablation)."""

    name: str
    contention: bool = True  # the run's CPU-sharing law, and rates on a free core
    by_workload: bool = True  # each workload its own start-up (else one median)
    finish: bool = True  # the end of a job holds its GPUs
    rules: bool = True  # switches take time (and lock the size); no growth near the end
    peers: bool = True  # sizes a job never ran at: its workload's rates there
    learn: bool = True  # the policy sees what the job measured so far (else all of it)
    own: bool = True  # each job its own start-up and end, as measured (else the medians)
    reported: bool = True  # the policy learns the reported rates (live curve), not free-core
    per_tick: bool = True  # every pass on a fresh policy core, as the live tick's snapshot
    suspects: bool = True  # GPUs marked suspect (straggler reports) are out of service
    one_pass: bool = True  # a refused start waits for the next pass (the tick binds once)
    handover: bool = True  # the control plane sees arrivals and ends late (its delays)
    leavers: bool = True  # a scale-in's leavers share the CPUs until their switch is done
    follow: bool = True  # a scale-in during a start-up is done after it, as it is stretched
    cap: bool = True  # a job about to end is shown to the policy capped at its size
    pin: bool = True  # a job with a switch in flight is pinned at its size for the policy
    # A start whose extras fit no shape waits whole, as the live binder refused it before
    # 2026-12-03 21:52 (else it starts on its base, as bind() does since).  Those runs' rule,
    # but off in the comparison: on, the 19:12 run loses a sub-second race its fallback won
    # (docs/benchmarks.md, "The busy window of 19:40").
    whole: bool = False
    # A start that fits no shape goes before the jobs shrunk for it (True), or the shrinks
    # keep their GPUs in place (False); None: as the run's recorded binder did.
    reshape: bool | None = None


def run_binder(meta: dict[str, Any]) -> StartBinder:
    """The live binder the run was made with, as its record names it (``_meta.binder``)."""
    if "binder" not in meta:
        raise ValueError(
            "the run records no binder: add _meta.binder, one of " + ", ".join(BINDERS)
        )
    return binder_named(str(meta["binder"]))


def replay_binder(model: Model, recorded: StartBinder) -> StartBinder:
    """The binder a replay under ``model`` binds with: the run's way with shrinks (unless the
    model names one), an elastic start on its base unless the model refuses it whole."""
    reshapes = recorded.reshapes if model.reshape is None else model.reshape
    return binder_with(starts_on_base=not model.whole, reshapes=reshapes)


def binder_with(*, starts_on_base: bool, reshapes: bool) -> StartBinder:
    """The named binder with these two rules (an ablation turns one of them)."""
    for binder in BINDERS.values():
        if binder.starts_on_base == starts_on_base and binder.reshapes == reshapes:
            return binder
    raise AssertionError("every pair of binder rules has a name")  # pragma: no cover


def fidelity(model: Model, recorded: StartBinder) -> Fidelity:
    """The live tick's rules (``LIVE_TICK``) less those ``model`` leaves out."""
    shared_cpu = model.contention  # the leavers' rules are about CPUs the slots share
    return Fidelity(
        ending=EndingJobs.SHOWN_CAPPED if model.cap else EndingJobs.GROWTH_REFUSED,
        switching=SwitchingJobs.SHOWN_PINNED if model.pin else SwitchingJobs.RESIZE_REFUSED,
        rounds=BindingRounds.ONCE_PER_TICK
        if model.one_pass
        else BindingRounds.RETRY_AROUND_REFUSALS,
        binder=replay_binder(model, recorded),
        leavers=LeaversSlots.BUSY_UNTIL_GONE
        if model.leavers and shared_cpu
        else LeaversSlots.FREE_AT_DECISION,
        start_up_scale_in=StartUpScaleIn.AFTER_START_UP
        if model.follow and shared_cpu
        else StartUpScaleIn.DUE_AS_DECIDED,
    )


# The model of the section "with the fixed costs" (docs/benchmarks.md), before the parts
# that follow the live control plane's rules (own costs, delays, reported rates, per tick).
BEFORE = Model(
    "before (control-plane parts off)",
    own=False,
    handover=False,
    reported=False,
    per_tick=False,
    suspects=False,
    one_pass=False,
    leavers=False,
    follow=False,
    cap=False,
    pin=False,
)
# The model of the section "the live control plane's rules", before the CPU-sharing
# parts that followed it (the leavers' slots).
RULES = Model(
    "control-plane rules (leavers not busy)", leavers=False, follow=False, cap=False, pin=False
)
# ... and with them: the model as the six saved runs shaped it, before the 19:12 run.
LEAVERS = Model("with the leavers' slots (ending refused, not capped)", cap=False, pin=False)
MODELS = (
    Model("full"),
    Model("no contention", contention=False),
    Model("one start-up", by_workload=False),
    Model("no finish cost", finish=False),
    Model("no switch times or end rule", rules=False),
    Model("no workload rates", peers=False),
    Model("policy sees the measured curves", learn=False),
    Model("workload start-ups and ends", own=False),
    Model("no control-plane delays", handover=False),
    Model("policy learns free-core rates", reported=False),
    Model("one policy core for the run", per_tick=False),
    Model("no suspect GPUs", suspects=False),
    Model("a second pass around refusals", one_pass=False),
    Model("leavers not busy", leavers=False),
    Model("scale-in during a start-up due as first stretched", follow=False),
    Model("+ a start refused whole (the old live binder's rule)", whole=True),
    Model("shrinks kept in place (the binder before 2026-12-04)", reshape=False),
    Model("a start placed before the jobs shrunk for it (since 2026-12-04)", reshape=True),
    Model("a switching job's resize refused after the pass (before 2026-12-04 13:24)", pin=False),
    LEAVERS,
    RULES,
    BEFORE,
    replace(BEFORE, name="before + own start-ups and ends alone", own=True),
    replace(BEFORE, name="before + control-plane delays alone", handover=True),
    replace(BEFORE, name="before + reported rates alone", reported=True),
    replace(BEFORE, name="before + a fresh core per pass alone", per_tick=True),
    replace(BEFORE, name="before + suspect GPUs alone", suspects=True),
    replace(BEFORE, name="before + one pass per tick alone", one_pass=True),
    replace(
        BEFORE,
        name="none of them",
        contention=False,
        by_workload=False,
        finish=False,
        rules=False,
        peers=False,
        learn=False,
    ),
)


def costs(measured: dict[str, Any], model: Model) -> dict[str, Any]:
    """The cost model's figures from the run: medians of what it measured."""
    jobs = [j for j in measured["jobs"].values() if j["state"] == "completed"]
    key = "free_startup" if model.contention else "startup"
    startups: dict[str, list[float]] = {}
    for j in jobs:
        if j[key] is not None:
            startups.setdefault(j["workload"], []).append(j[key])
    everyone = [v for values in startups.values() for v in values]
    switches: list[Switch] = measured["switches"]
    joins = [s.done - s.decided for s in switches if s.new > s.old]
    # A scale-in is done once the job trains and the leavers have stopped: time from
    # whichever came last, the decision or the job's first step.
    firsts = {name: j["first_step"] for name, j in measured["jobs"].items()}
    leaves = [
        s.done - max(s.decided, firsts[s.job] or s.decided) for s in switches if s.new < s.old
    ]
    pauses = [s.pause_s for s in switches if s.pause_s is not None and s.new > s.old]
    first = round(median_or(everyone, 0.0), 3)
    wall = median_or([j["startup"] for j in jobs if j["startup"] is not None], 0.0)
    return {
        "first_start_s": first,
        # A preempted job starts again as it first started (no preemption in the live run
        # to measure; its start-up, in the run's wall clock, is the best guess).
        "restart_s": round(wall, 3),
        "first_start_by_model": (
            {w: round(statistics.median(v), 3) for w, v in sorted(startups.items())}
            if model.by_workload
            else {}
        ),
        "finish_s": (
            round(median_or([j["finish"] for j in jobs if j["finish"] is not None], 0.0), 3)
            if model.finish
            else 0.0
        ),
        "join_s": round(median_or(joins, 0.0), 3) if model.rules else 0.0,
        "leave_s": round(max(0.0, median_or(leaves, 0.0)), 3) if model.rules else 0.0,
        "broadcast_s": round(median_or(pauses, 0.0), 3),
        # Each job's own start-up (free-core seconds under the start law, as the medians
        # above) and end: measured per job as its rates are.
        "first_start_by_job": (
            {n: round(j[key], 3) for n, j in measured["jobs"].items() if j[key] is not None}
            if model.own
            else {}
        ),
        "finish_by_job": (
            {
                n: round(j["finish"], 3)
                for n, j in measured["jobs"].items()
                if j["finish"] is not None
            }
            if model.own and model.finish
            else {}
        ),
    }


def delays(measured: dict[str, Any], model: Model) -> dict[str, float]:
    """The control plane's delays for the simulator (``SimConfig.arrival_s``, ``release_s``)."""
    if not model.handover:
        return {"arrival_s": 0.0, "release_s": 0.0}
    return {
        "arrival_s": round(median_or(measured["arrivals"], 0.0), 3),
        "release_s": round(median_or(measured["handovers"], 0.0), 3),
    }


def simulate_trace(
    trace: list[dict[str, Any]],
    measured: dict[str, Any],
    policy_name: str,
    model: Model,
    trail: list[tuple[float, str, int, tuple[int, ...]]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The simulator's result per job (start, end, JCT) given what the real run measured.

    ``trail``, when given, receives every placement the simulation made:
    (time, job, GPUs, GPU ids), 0 GPUs for a job's end (``--timeline``).
    """
    from fabric.topology import FabricSpec
    from scheduler.fabric_placement import sim_placement
    from scheduler.policies import get_policy
    from scheduler.simulator import Outage, ScalingCost, SimConfig, simulate
    from scheduler.traces import TraceJob

    jobs = measured["jobs"]
    fit: CpuFit = measured["fit"]
    start_fit: CpuFit = measured["start_fit"]
    origin = min(j["submit"] for j in jobs.values())
    figures = costs(measured, model)
    control = delays(measured, model)
    table: dict[str, MeasuredJob] = {}
    rows: list[TraceJob] = []
    rate_key = "free_rates" if model.contention else "rates"
    totals_key = "free_totals" if model.contention else "wall_totals"
    peers: dict[str, dict[int, float]] = {}
    for workload in {j["workload"] for j in jobs.values()}:
        peers[workload] = pooled_rates(
            (n, steps, seconds)
            for j in jobs.values()
            if j["workload"] == workload
            for n, (steps, seconds) in j[totals_key].items()
        )
    for job in trace:
        got = jobs[job["name"]]
        rates = {int(n): float(r) for n, r in got[rate_key].items()}
        if not rates:
            continue
        mj = MeasuredJob(
            job["name"], job["gpus"], job["min_gpus"], job["max_gpus"], got["steps"], rates,
            peers[job["workload"]] if model.peers else {},
            got["seen"] if model.reported else {},
        )  # fmt: skip
        table[mj.id] = mj
        rows.append(
            TraceJob(mj.id, got["submit"] - origin, mj.requested, mj.duration(), job["workload"])
        )
    rows.sort(key=lambda r: (r.submit, r.id))
    inner = get_policy(policy_name)
    inner.class_ageing_s = 24 * 3600.0  # CLASS_AGEING_SECONDS' default, as live_policy sets it
    cfg = SimConfig(
        total_gpus=GPUS,
        gpus_per_server=GPUS_PER_SERVER,
        tick=TICK_S,
        cost=ScalingCost("stop_free", **figures),
        placement="vclos",
        fabric=FabricSpec(**DEMO_FABRIC),
        slot_slowdown=fit.cpu.table(GPUS) if model.contention else (),
        start_slowdown=start_fit.cpu.table(GPUS) if model.contention else (),
        grow_min_left_s=SCALE_OUT_MIN_SECONDS_LEFT if model.rules else 0.0,
        arrival_s=control["arrival_s"],
        release_s=control["release_s"],
        outages=tuple(
            Outage(m["at"] - origin, m["until"] - origin, m["gpu"], m["holder"])
            for m in measured["suspects"]
        )
        if model.suspects
        else (),
        fidelity=fidelity(model, run_binder(measured["meta"])),
    )
    policy: Policy = MeasuredPolicy(inner, table, learn=model.learn, per_tick=model.per_tick)
    if trail is None:
        result = simulate(rows, policy, cfg)
    else:
        clock = Clock()
        placement, _ = sim_placement(
            "vclos", GPUS, GPUS_PER_SERVER, cfg.fabric, reshape=cfg.fidelity.binder.reshapes
        )
        result = simulate(
            rows,
            ClockedPolicy(policy, clock),
            cfg,
            placement=TracedPlacement(placement, clock, trail),
        )
    out = {r.id: {"start": r.start, "end": r.end, "jct": r.jct} for r in result.jobs}
    figures = {**figures, **control}
    if trail is not None:
        trail += [(r.end, r.id, 0, ()) for r in result.jobs]
        trail.sort(key=lambda e: e[0])
    return out, figures


class Clock:
    """The simulated time of the pass in progress (set by :class:`ClockedPolicy`)."""

    now = 0.0


class ClockedPolicy(Policy):
    """``inner``, with each pass's time written to ``clock`` (for :class:`TracedPlacement`)."""

    def __init__(self, inner: Policy, clock: Clock) -> None:
        self.inner, self.clock = inner, clock
        self.name = inner.name
        self.elastic = bool(getattr(inner, "elastic", False))
        self.class_ageing_s = inner.class_ageing_s

    def new_core(self, total_gpus: int) -> PolicyCore:
        """The inner core; its ``decide`` sets the clock first."""
        core = self.inner.new_core(total_gpus)
        decide, clock = core.decide, self.clock

        def clocked(now: float) -> Plan:
            clock.now = now
            return decide(now)

        setattr(core, "decide", clocked)  # noqa: B010 - an instance hook on a core we own
        return core


class TracedPlacement:
    """A simulator placement that writes down every placement it grants (``--timeline``)."""

    def __init__(
        self, inner: Any, clock: Clock, trail: list[tuple[float, str, int, tuple[int, ...]]]
    ) -> None:
        self.inner, self.clock, self.trail = inner, clock, trail
        self.name = inner.name
        self.allocator = getattr(inner, "allocator", None)  # what outages take GPUs off

    def admits(self, n: int) -> bool:
        """As the inner placement."""
        return bool(self.inner.admits(n))

    def place(self, job: str, n: int) -> tuple[int, ...] | None:
        """As the inner placement; a grant is written down."""
        gpus: tuple[int, ...] | None = self.inner.place(job, n)
        if gpus is not None:
            self.trail.append((self.clock.now, job, n, tuple(gpus)))
        return gpus

    def release(self, job: str) -> None:
        """As the inner placement."""
        self.inner.release(job)

    def begin_pass(self) -> None:
        """As the inner placement."""
        self.inner.begin_pass()


# ----------------------------------------------------------------------------- the report

LEAVES = re.compile(r"leaves \[([0-9, ]+)\]")
GPUS_PER_LEAF = DEMO_FABRIC["servers_per_leaf"] * DEMO_FABRIC["gpus_per_server"]


def real_trail(trace: list[dict[str, Any]], real: dict[str, Any], origin: float) -> list[Any]:
    """The live run's placements as (time since the first submission, job, GPUs, leaves).

    From each job's events: its placement, a scale-out's decision (the newcomers
    start then), a switch done (the size the runtime reports), its end (0 GPUs).
    """
    out: list[tuple[float, str, int, str]] = []
    for job in trace:
        name = job["name"]
        for event in sorted(real[name]["events"], key=lambda e: (e["at"], e["id"])):
            at = (ts(event["at"]) or 0.0) - origin
            leaves = LEAVES.search(event["reason"])
            where = leaves[1].replace(" ", "") if leaves else ""
            size = event["to_parallelism"]
            resize = RESIZE.match(event["reason"])
            if event["kind"] != "state":
                continue
            if (event["from_state"], event["to_state"]) == ("queued", "running"):
                out.append((at, name, int(size or 0), where))
            elif resize and event["to_state"] == "scaling" and int(resize[3]) > int(resize[2]):
                out.append((at, name, int(resize[3]), where))
            elif event["reason"].startswith("switch done"):
                out.append((at, name, int(size or 0), ""))
            elif event["to_state"] in ENDED:
                out.append((at, name, 0, ""))
    return sorted(out, key=lambda e: e[0])


def holding(trail: list[Any], at: float) -> dict[str, int]:
    """Who held how many GPUs just before ``at``, from a trail of (time, job, GPUs, ...)."""
    held: dict[str, int] = {}
    for when, job, n, *_ in trail:
        if when >= at:
            break
        if n:
            held[job] = n
        else:
            held.pop(job, None)
    return held


def timeline(
    trace: list[dict[str, Any]],
    measured: dict[str, Any],
    real: dict[str, Any],
    sim_trail: list[Any],
) -> None:
    """Per job, in order of arrival: real and simulated start, size, leaves and who held GPUs.

    Where the two runs part, the first job whose start differs by more than a
    tick shows what each control plane saw: the jobs running on each side.
    """
    jobs = measured["jobs"]
    origin = min(j["submit"] for j in jobs.values())
    live = real_trail(trace, real, origin)
    print(
        f"{'job':<4} {'arrive':>6} {'gpus':>6} | {'real':>6} {'n':>2} {'leaf':<5} {'end':>6} | "
        f"{'sim':>6} {'n':>2} {'leaf':<5} {'end':>6} | {'d start':>7}  held at the real / sim start"
    )
    for job in sorted(trace, key=lambda j: jobs[j["name"]]["submit"]):
        name = job["name"]
        got = jobs[name]
        arrive = got["submit"] - origin
        mine = [e for e in live if e[1] == name]
        sims = [e for e in sim_trail if e[1] == name]
        r_start = mine[0] if mine else (math.nan, name, 0, "")
        s_start = sims[0] if sims else (math.nan, name, 0, ())
        s_leaf = ",".join(str(x) for x in sorted({g // GPUS_PER_LEAF for g in s_start[3]}))
        r_end = got["end"] - origin if got["end"] else math.nan
        s_end = sims[-1][0] if sims else math.nan
        held_r = holding(live, r_start[0] + 1e-6)
        held_s = holding(sim_trail, s_start[0] + 1e-6)

        def fmt(held: dict[str, int], me: str = name) -> str:
            return " ".join(f"{j[1:]}:{n}" for j, n in sorted(held.items()) if j != me)

        rng = f"{job['min_gpus']}-{job['gpus']}-{job['max_gpus']}"
        print(
            f"{name:<4} {arrive:>6.1f} {rng:>6} | {r_start[0]:>6.1f} {r_start[2]:>2} {r_start[3]:<5} "
            f"{r_end:>6.1f} | {s_start[0]:>6.1f} {s_start[2]:>2} {s_leaf:<5} {s_end:>6.1f} | "
            f"{s_start[0] - r_start[0]:>+7.1f}  [{fmt(held_r)}] / [{fmt(held_s)}]"
        )
    print("resizes (real | sim):")
    for side, trail in (("real", live), ("sim", sim_trail)):
        sizes: dict[str, int] = {}
        moves = []
        for when, job, n, *_ in trail:
            if job in sizes and n and n != sizes[job]:
                moves.append(f"{job} {sizes[job]}->{n} @{when:.1f}")
            sizes[job] = n
        print(f"  {side}: " + "; ".join(moves))


def trail_busy(trail: list[Any]) -> BusySlots:
    """The simulated busy slots from a trail of placements (a scale-in's leavers not counted)."""
    sizes: dict[str, int] = {}
    changes: list[tuple[float, int]] = []
    for when, job, n, *_ in sorted(trail, key=lambda e: e[0]):
        changes.append((when, n - sizes.get(job, 0)))
        sizes[job] = n
    return BusySlots(changes)


def run_times(
    trace: list[dict[str, Any]], measured: dict[str, Any], sim: dict[str, Any], trail: list[Any]
) -> None:
    """Per job: its run (placement to end) live and simulated, and the CPU factor of the busy
    slots each side saw; then the law's check where it was fitted (:func:`law_by_busy`).

    A run longer simulated than live with a larger factor is the order (who ran
    beside it), not the law; a run that differs at the same factor is the law's
    error, or a cost's.
    """
    jobs = measured["jobs"]
    cpu = measured["fit"].cpu
    live: BusySlots = measured["busy"]
    simulated = trail_busy(trail)

    def factor(busy: BusySlots, t0: float, t1: float) -> float:
        return sum(dt * cpu.factor(n) for dt, n in busy.pieces(t0, t1)) / (t1 - t0)

    print(f"{'job':<4} {'workload':<18} {'real run':>8} {'sim run':>8} {'diff':>7} "
          f"{'busy':>5} {'sim':>5} {'factor':>7}")  # fmt: skip
    gaps: list[float] = []
    for job in trace:
        name, got = job["name"], jobs[job["name"]]
        if got["state"] != "completed" or name not in sim:
            continue
        real_run = got["end"] - got["start"]
        sim_run = sim[name]["end"] - sim[name]["start"]
        run = (sim_run - real_run) / real_run
        crowd = factor(simulated, sim[name]["start"], sim[name]["end"])
        crowd = crowd / factor(live, got["start"], got["end"]) - 1
        gaps.append(run - crowd)
        print(
            f"{name:<4} {job['workload']:<18} {real_run:>8.1f} {sim_run:>8.1f} {run:>+7.1%} "
            f"{live.mean(got['start'], got['end']):>5.2f} "
            f"{simulated.mean(sim[name]['start'], sim[name]['end']):>5.2f} {crowd:>+7.1%}"
        )
    if gaps:
        print(
            f"run time less factor: mean {statistics.fmean(gaps):+.1%}, "
            f"sd {statistics.pstdev(gaps):.1%} over {len(gaps)} jobs"
        )
    check = law_by_busy(
        measured["samples"],
        {name: j["free_rates"] for name, j in jobs.items()},
        {name: j["workload"] for name, j in jobs.items()},
        live,
        cpu,
    )
    print("the law where it was fitted (steps done / steps the law predicts, seconds):")
    for workload in sorted({w for w, _ in check}):
        cells = [f"{n}: {r:.3f} ({s:.0f})" for (w, n), (r, s) in check.items() if w == workload]
        print(f"  {workload}: " + ", ".join(cells))


def compare(
    trace: list[dict[str, Any]],
    measured: dict[str, Any],
    sim: dict[str, Any],
    *,
    show: bool = True,
) -> dict[str, Any]:
    """The job-by-job table (printed when ``show``) and the summary."""
    jobs = measured["jobs"]
    header = (
        f"{'job':<4} {'workload':<18} {'gpus':>6} {'steps':>6} {'sizes':<7} {'start-up':>8} "
        f"{'end':>5} {'wait':>6} {'sim':>6} {'real':>7} {'sim':>7} {'error':>7}"
    )
    lines = [header]
    real_jcts, sim_jcts, errors = [], [], []
    left_out: list[str] = []
    for job in trace:
        got = jobs[job["name"]]
        if got["state"] != "completed" or job["name"] not in sim:
            lines.append(f"{job['name']:<4} {got['state']}, {got['reports']} reports (left out)")
            left_out.append(job["name"])
            continue
        real, simulated = float(got["jct"]), sim[job["name"]]["jct"]
        err = (simulated - real) / real
        real_jcts.append(real)
        sim_jcts.append(simulated)
        errors.append(abs(err))
        rng = f"{job['min_gpus']}-{job['gpus']}-{job['max_gpus']}"
        sizes = ",".join(str(s) for s in got["sizes"])
        wait = got["start"] - got["submit"]
        sim_wait = sim[job["name"]]["start"] - (
            got["submit"] - min(j["submit"] for j in jobs.values())
        )
        lines.append(
            f"{job['name']:<4} {job['workload']:<18} {rng:>6} {got['steps']:>6} {sizes:<7} "
            f"{got['startup'] or 0:>8.1f} {got['finish'] or 0:>5.1f} {wait:>6.1f} {sim_wait:>6.1f} "
            f"{real:>7.1f} {simulated:>7.1f} {err:>+7.1%}"
        )
    if show:
        for line in lines:
            print(line)
    real_avg = statistics.fmean(real_jcts) if real_jcts else 0.0
    sim_avg = statistics.fmean(sim_jcts) if sim_jcts else 0.0
    fit: CpuFit = measured["fit"]
    start_fit: CpuFit = measured["start_fit"]
    loads = [x[0] for x in measured["meta"].get("load", [])]
    return {
        "real_avg_jct": round(real_avg, 2),
        "sim_avg_jct": round(sim_avg, 2),
        "error": round((sim_avg - real_avg) / real_avg, 4) if real_avg else None,
        "max_job_error": round(max(errors), 4) if errors else None,
        "mean_job_error": round(statistics.fmean(errors), 4) if errors else None,
        "jobs": len(real_jcts),
        "left_out": left_out,
        "within_targets": bool(
            real_avg
            and not left_out
            and abs(sim_avg - real_avg) / real_avg <= TARGET_AVG
            and max(errors) <= TARGET_JOB
        ),
        "jobs_within_25pct": sum(1 for e in errors if e <= TARGET_JOB),
        "cpu": {
            "cores": fit.cpu.cores,
            "external": fit.cpu.external,
            "residual": round(fit.residual, 5),
            "residual_without": round(fit.residual_without, 5),
            "start_external": start_fit.cpu.external,
            "start_residual": round(start_fit.residual, 5),
            "start_residual_without": round(start_fit.residual_without, 5),
        },
        "external_by_minute": [round(e, 1) for _, e, _ in measured["drift"]],
        "clean": measured["meta"].get("clean"),
        "run_load_1min": [min(loads), max(loads)] if loads else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="the trace's first N jobs")
    parser.add_argument("--policy", default="elastic-tiresias")
    parser.add_argument("--redis-db", type=int, default=10, help="a Redis db no one else uses")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--write-trace", action="store_true", help="regenerate the trace file")
    parser.add_argument("--save", type=Path, help="also write the real run's records here (JSON)")
    parser.add_argument("--replay", type=Path, help="simulate against records saved by --save")
    parser.add_argument(
        "--ablation", action="store_true", help="also simulate without each part of the cost model"
    )
    parser.add_argument(
        "--runtimes",
        action="store_true",
        help="per job: run time live and simulated, the busy slots each side saw; the law's check",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="per job: real and simulated start, size, leaves, and who held GPUs then",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.write_trace:
        args.trace.write_text(json.dumps(make_trace(), indent=1) + "\n")
        log.info("wrote %s", args.trace)
        return 0
    trace = json.loads(args.trace.read_text())[: args.jobs]
    began = time.monotonic()
    if args.replay:
        real = json.loads(args.replay.read_text())
        trace = [job for job in trace if job["name"] in real]
    else:
        if not os.environ.get("DATABASE_URL"):
            log.warning("DATABASE_URL is not set: the stack runs on SQLite")
        real = run_real(trace, args.policy, args.redis_db)
        if args.save:
            args.save.write_text(json.dumps(real))
    measured = measure(trace, real)
    if args.ablation:
        for model in MODELS[1:]:
            variant, figures = simulate_trace(trace, measured, args.policy, model)
            row = compare(trace, measured, variant, show=False)
            keep = (
                "real_avg_jct",
                "sim_avg_jct",
                "error",
                "max_job_error",
                "mean_job_error",
                "jobs_within_25pct",
            )
            print(json.dumps({"model": model.name, **{k: row[k] for k in keep}}))
    trail: list[tuple[float, str, int, tuple[int, ...]]] = []
    sim, figures = simulate_trace(
        trace, measured, args.policy, MODELS[0], trail if args.timeline or args.runtimes else None
    )
    if args.timeline:
        timeline(trace, measured, real, trail)
    if args.runtimes:
        run_times(trace, measured, sim, trail)
    summary = compare(trace, measured, sim)
    # Each job's own start-up and end are in the table above (start-up, end).
    summary["costs"] = {k: v for k, v in figures.items() if not k.endswith("_by_job")}
    summary["handovers"] = len(measured["handovers"])
    summary["arrivals"] = len(measured["arrivals"])
    summary["suspect_gpus"] = len(measured["suspects"])
    summary["policy"] = args.policy
    summary["wall_s"] = round(time.monotonic() - began, 1)
    summary["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
