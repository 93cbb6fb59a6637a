"""Benchmark: how close the predicted start (``scheduler.forecast``) is to the actual one.

A trace slice is replayed in the simulator (the ground truth).  Every ``--every``
seconds of simulated time, just before the policy's pass, the state of the
simulation is taken (queued and running jobs, their attained service and the
work they have left) and the forecast predicts every queued, never-started
job's start from it, as the portal does from its database.  Each prediction
is compared with the start the replay then gives that job.

Jobs that arrive after a snapshot are unknown to its forecast, as in
production; the error includes them.  Prints median and p90 of the absolute
error and of the error relative to the job's remaining wait (actual start
minus snapshot time), and the forecast's time; the last line is one JSON
object with every figure.

    .venv/bin/python bench/forecast_accuracy.py                 # 60_job.csv, 16 GPUs
    .venv/bin/python bench/forecast_accuracy.py --scale 10 --gpus 8
    .venv/bin/python bench/forecast_accuracy.py --philly --vc ee9e8c \
        --from 2017-10-23 --to 2017-10-30 --gpus 64 --every 21600
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.forecast import (
    DEFAULT_MAX_STEP_S,
    DEFAULT_STEP_S,
    Estimate,
    Forecast,
    forecast,
    steady,
)
from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.records import JobRecord
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import load_philly, load_tiresias, shared_trace
from scheduler.types import Cluster, Gpu, GpuState, JobState, JobView, Migrate, Snapshot


class _ObservedCore:
    """A policy core that lets a callback see the live jobs before each pass (else unchanged)."""

    def __init__(self, core: PolicyCore, on_pass: Any) -> None:
        self._core = core
        self._on_pass = on_pass
        self.live: dict[str, JobRecord] = {}

    def add(self, job: JobRecord, now: float) -> None:
        self.live[job.id] = job
        self._core.add(job, now)

    def remove(self, job: JobRecord, now: float) -> None:
        self.live.pop(job.id, None)
        self._core.remove(job, now)

    def decide(self, now: float) -> Plan:
        self._on_pass(now, self.live.values())
        return self._core.decide(now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


class _ObservedPolicy(Policy):
    """The production policy, its core observed."""

    def __init__(self, inner: Policy, on_pass: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.elastic = bool(getattr(inner, "elastic", False))
        self._on_pass = on_pass

    def new_core(self, total_gpus: int) -> PolicyCore:
        observed: Any = _ObservedCore(self.inner.new_core(total_gpus), self._on_pass)
        return observed  # duck-typed: every other call goes to the real core


def snapshot_of(
    now: float, jobs: Iterable[JobRecord], total_gpus: int, per_server: int
) -> Snapshot:
    """The simulation's state at ``now`` as the portal's snapshot would hold it."""
    views: list[JobView] = []
    next_gpu = 0
    busy: dict[int, str] = {}
    for rec in sorted(jobs, key=lambda r: (r.submit, r.idx)):
        rec.settle(now)  # idempotent: the simulator's own books come to the same values
        gpus: tuple[int, ...] = ()
        if rec.running and rec.alloc > 0:
            gpus = tuple(range(next_gpu, next_gpu + rec.alloc))
            next_gpu += rec.alloc
            busy.update(dict.fromkeys(gpus, rec.id))
        curve = None
        if rec.speed is not None:
            curve = {n: float(v) for n, v in enumerate(rec.speed) if n > 0 and v > 0}
        views.append(
            JobView(
                id=rec.id,
                submit_time=rec.submit,
                requested_gpus=rec.requested,
                tenant=rec.tenant,
                min_gpus=rec.min_gpus,
                max_gpus=rec.max_gpus,
                gpus=gpus,
                attained_service=rec.attained,
                remaining_work=max(0.0, rec.remaining),
                state=JobState.RUNNING if gpus else JobState.QUEUED,
                throughput=curve,
            )
        )
    cluster = Cluster(
        gpus=tuple(
            Gpu(
                id=i,
                server=i // per_server,
                leaf=0,
                state=GpuState.BUSY if i in busy else GpuState.FREE,
                job=busy.get(i),
            )
            for i in range(total_gpus)
        )
    )
    return Snapshot(now=now, cluster=cluster, jobs=tuple(views))


def refreshed(snap: Snapshot, dt: float, wobble: float = 0.0) -> Snapshot | None:
    """``snap`` ``dt`` seconds later when nothing happens but the running jobs' progress
    (the next refresh of an unchanged cluster), each one's remaining work off by the
    fraction ``wobble`` (a measured rate's noise); None when a running job would finish
    within ``dt`` (something changes)."""
    views = []
    for view in snap.jobs:
        if view.running:
            remaining = view.remaining_work
            rate = 1.0  # seconds of requested-size work per second, as the forecast's curve says
            if view.throughput and view.requested_gpus in view.throughput:
                held = len(view.gpus)
                known = view.throughput.get(held) or max(view.throughput.values())
                rate = known / view.throughput[view.requested_gpus]
            if remaining is not None:
                if remaining <= rate * dt:
                    return None
                remaining = (remaining - rate * dt) * (1.0 + wobble)
            view = replace(
                view,
                remaining_work=remaining,
                attained_service=view.attained_service + len(view.gpus) * dt,
            )
        views.append(view)
    return replace(snap, now=snap.now + dt, jobs=tuple(views))


def at_work(snap: Snapshot, policy: Policy) -> bool:
    """Whether the pass at ``snap.now`` changes something (the live tick would apply it
    before the next refresh, so that refresh would not see an unchanged cluster)."""
    decisions = policy.schedule(snap, placement=CountPlacement())
    return any(not isinstance(d, Migrate) for d in decisions)


def changes_within(result: Forecast, dt: float) -> bool:
    """Whether ``result`` itself predicts a start or a finish within ``dt``: the cluster
    then changes before the next refresh (a LAS demotion at the policy's own clock lets
    a queued job in), and that refresh would not see it unchanged.

    Before this check, such pairs were counted: every Elastic-Tiresias move of the
    60_job.csv x10 replay (37.5 s at most) was one, not the forecast's stepping.
    """
    return any(
        (e.start is not None and e.start <= dt) or (e.finish is not None and e.finish <= dt)
        for e in result.estimates.values()
    )


def _moved(at: float, first: Estimate, later_at: float, second: Estimate) -> float:
    """How far a job's predicted start moved between two refreshes (absolute seconds)."""
    return _distance(_absolute(at, first.start), _absolute(later_at, second.start))


def _absolute(at: float, seconds: float | None) -> float | None:
    return None if seconds is None else at + seconds


def _distance(a: float | None, b: float | None) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    return abs(a - b)


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> int:
    """Replay, predict at intervals, compare; print the table and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", default="elastic-tiresias")
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--gpus-per-server", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0, help="60_job.csv durations x this")
    parser.add_argument("--philly", action="store_true", help="a Philly slice, not 60_job.csv")
    parser.add_argument("--vc", default=None)
    parser.add_argument("--from", dest="start", default=None)
    parser.add_argument("--to", dest="end", default=None)
    parser.add_argument("--every", type=float, default=600.0, help="seconds between snapshots")
    parser.add_argument("--max-snapshots", type=int, default=200)
    parser.add_argument("--horizon", type=float, default=60 * 86400.0)
    parser.add_argument("--step", type=float, default=DEFAULT_STEP_S, help="forecast step (s)")
    parser.add_argument("--max-step", type=float, default=DEFAULT_MAX_STEP_S)
    parser.add_argument(
        "--noise",
        type=float,
        default=0.04,
        help="at the refresh, each running job's remaining work is off by up to this fraction",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--refresh",
        type=float,
        default=60.0,
        help="seconds to the next refresh, when nothing changes but the running jobs' progress",
    )
    args = parser.parse_args()

    if args.philly:
        trace = load_philly(
            shared_trace("philly.csv"),
            vc=args.vc,
            start=args.start,
            end=args.end,
            max_gpus=args.gpus,
        ).jobs
    else:
        trace = load_tiresias(
            shared_trace("60_job.csv"), duration_scale=args.scale, max_gpus=args.gpus
        ).jobs
    policy = get_policy(args.policy)
    predictions: list[tuple[float, str, float | None, str]] = []  # (at, job, start, reason)
    moves: list[float] = []  # |start at the refresh - start now|, absolute seconds (inf: came/went)
    shown_moves: list[
        float
    ] = []  # the same of what the portal publishes (scheduler.forecast.steady)
    noise = random.Random(args.seed)
    forecast_s: list[float] = []
    passes: list[int] = []
    next_at = trace[0].submit if trace else 0.0

    def predict(snap: Snapshot) -> Forecast:
        return forecast(
            snap,
            policy,
            horizon_s=args.horizon,
            step_s=args.step,
            max_step_s=args.max_step,
            max_passes=1_000_000,
        )

    def on_pass(now: float, live: Iterable[JobRecord]) -> None:
        nonlocal next_at
        if now < next_at or len(forecast_s) >= args.max_snapshots:
            return
        next_at = now + args.every
        jobs = list(live)
        waiting = [r for r in jobs if not r.running and r.start_time is None]
        if not waiting:
            return
        snap = snapshot_of(now, jobs, args.gpus, args.gpus_per_server)
        t0 = time.perf_counter()
        result = predict(snap)
        forecast_s.append(time.perf_counter() - t0)
        passes.append(result.passes)
        for rec in waiting:
            est = result.estimates[rec.id]
            start = None if est.start is None else now + est.start
            predictions.append((now, rec.id, start, est.reason))
        later = refreshed(snap, args.refresh, noise.uniform(-args.noise, args.noise))
        if later is None or at_work(snap, policy) or changes_within(result, args.refresh):
            return
        again = predict(later)
        for rec in waiting:
            first, second = result.estimates[rec.id], again.estimates[rec.id]
            moves.append(_moved(now, first, later.now, second))
            published = _absolute(now, first.start)
            shown = steady(published, _absolute(later.now, second.start), later.now)
            shown_moves.append(_distance(published, shown))

    cfg = SimConfig(total_gpus=args.gpus, gpus_per_server=args.gpus_per_server)
    t0 = time.perf_counter()
    sim = simulate(trace, _ObservedPolicy(policy, on_pass), cfg)
    wall = time.perf_counter() - t0
    actual = {r.id: r.start for r in sim.jobs}

    abs_err: list[float] = []
    rel_err: list[float] = []
    missing: dict[str, int] = {}
    unfinished = 0
    for at, job, predicted, reason in predictions:
        if job not in actual:
            unfinished += 1
            continue
        if predicted is None:
            missing[reason or "?"] = missing.get(reason or "?", 0) + 1
            continue
        err = abs(predicted - actual[job])
        wait = actual[job] - at
        abs_err.append(err)
        rel_err.append(err / wait if wait > 0 else (0.0 if err == 0 else math.inf))

    figures = {
        "trace": f"philly {args.vc or 'all'} {args.start}..{args.end}"
        if args.philly
        else f"60_job.csv x{args.scale:g}",
        "policy": args.policy,
        "gpus": args.gpus,
        "jobs": len(trace),
        "snapshots": len(forecast_s),
        "predictions": len(abs_err),
        "no_prediction": missing,
        "median_abs_error_s": round(_pct(abs_err, 0.5), 1),
        "p90_abs_error_s": round(_pct(abs_err, 0.9), 1),
        "median_rel_error": round(_pct(rel_err, 0.5), 3),
        "p90_rel_error": round(_pct(rel_err, 0.9), 3),
        "exact_within_1s": round(sum(e <= 1.0 for e in abs_err) / max(1, len(abs_err)), 3),
        "median_forecast_ms": round(1000 * _pct(forecast_s, 0.5), 1),
        "max_forecast_ms": round(1000 * max(forecast_s, default=0.0), 1),
        "median_passes": _pct([float(p) for p in passes], 0.5),
        "refresh_s": args.refresh,
        "refresh_pairs": len(moves),
        "refresh_moved_over_60s": round(sum(m > 60 for m in moves) / max(1, len(moves)), 3),
        "refresh_p90_move_s": round(_pct([min(m, 1e12) for m in moves], 0.9), 1),
        "refresh_max_move_s": round(max((m for m in moves if m != math.inf), default=0.0), 1),
        "refresh_appeared_or_vanished": sum(m == math.inf for m in moves),
        "refresh_noise": args.noise,
        "published_moved_over_60s": round(
            sum(m > 60 for m in shown_moves) / max(1, len(shown_moves)), 3
        ),
        "published_moved_at_all": round(
            sum(m > 0 for m in shown_moves) / max(1, len(shown_moves)), 3
        ),
        "published_max_move_s": round(
            max((m for m in shown_moves if m != math.inf), default=0.0), 1
        ),
        "replay_wall_s": round(wall, 2),
    }
    print(
        f"{figures['trace']}, {args.policy}, {args.gpus} GPUs: {len(abs_err)} predictions "
        f"from {len(forecast_s)} snapshots ({sum(missing.values())} without, {unfinished} unfinished)"
    )
    print(
        f"  absolute error: median {figures['median_abs_error_s']} s, p90 "
        f"{figures['p90_abs_error_s']} s; relative to the wait: median "
        f"{figures['median_rel_error']}, p90 {figures['p90_rel_error']}"
    )
    print(
        f"  forecast: median {figures['median_forecast_ms']} ms, max "
        f"{figures['max_forecast_ms']} ms ({figures['median_passes']} passes); replay {wall:.1f} s"
    )
    print(
        f"  refresh after {args.refresh:g} s with nothing changed: {len(moves)} pairs, "
        f"{figures['refresh_moved_over_60s']:.1%} moved > 60 s, p90 "
        f"{figures['refresh_p90_move_s']} s, max {figures['refresh_max_move_s']} s, "
        f"{figures['refresh_appeared_or_vanished']} appeared or vanished (rates off by up to "
        f"{args.noise:.0%}); published: {figures['published_moved_at_all']:.1%} moved at all, "
        f"{figures['published_moved_over_60s']:.1%} > 60 s, max {figures['published_max_move_s']} s"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
