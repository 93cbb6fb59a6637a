"""``python -m scheduler``: simulate one policy or compare several on a trace (no Django).

Every policy runs with every placement (``--placement count|consolidated|vclos|ecmp``;
the fabric ones on ``--leaves`` leaves) through the one simulator loop.

Bad input (unknown options or choices, unreadable traces, missing columns, bad
thresholds) prints one line ``error: ...`` and exits with status 2.  Bad
rows (negative durations, unparsable numbers, jobs larger than the cluster)
are skipped and counted by default; ``--on-error fail`` makes the first one
an error (status 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from fabric.errors import TopologyError
from scheduler.fabric_placement import MIX_MODELS, SIM_PLACEMENTS, TRAFFIC, fabric_spec_for
from scheduler.fairshare import FAIR_SHARE_HALF_LIFE, parse_weights
from scheduler.gpu_types import parse_type_numbers
from scheduler.policies import REGISTRY, get_policy
from scheduler.priority import (
    CLASS_AGEING_S,
    CLASS_NAMES,
    assign_priorities,
    parse_ageing,
    parse_shares,
)
from scheduler.quota import parse_quota
from scheduler.sim_config import (
    BINDERS,
    FIDELITIES,
    IDEAL,
    Fidelity,
    StartBinder,
    binder_named,
    fidelity_named,
)
from scheduler.sim_types import TypePool, assign_types, parse_pools, simulate_mixed
from scheduler.simulator import ScalingCost, SimConfig, SimResult, simulate
from scheduler.traces import (
    LoadedTrace,
    TraceError,
    edl_synthetic,
    load_philly,
    load_tiresias,
    poisson_workload,
    shared_trace,
    vclos_workload,
)

PLACEMENTS = SIM_PLACEMENTS
#: Elastic scale-out bound (``--max-scale``): 0 is "bounded by the throughput curve only",
#: EDL's R2 ("idle GPUs go to the largest marginal speedup until no gain is positive"; the
#: paper names no multiple of the request).  ``SimConfig``'s own default stays 2.0 (the
#: what-if page and the forecast use it); docs/results.md §11 measures both.
DEFAULT_MAX_SCALE = 0.0
DEFAULT_MAX_SCALE_TEXT = "curve" if DEFAULT_MAX_SCALE == 0 else f"{DEFAULT_MAX_SCALE:g}"
EPILOG = (
    "Bad rows (negative durations, unparsable numbers, jobs larger than the cluster) are "
    "skipped and counted in the output by default; with --on-error fail the first one is an "
    "error. Any error exits with status 2."
)


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (then exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Report ``message`` in one line and exit with status 2."""
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _thresholds(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad --queue-thresholds {text!r} (use e.g. 3250,7200)"
        ) from None
    if not values or any(v <= 0 for v in values) or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError("queue thresholds must be positive and increasing")
    return values


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --sizes {text!r} (use e.g. 4,8,16)") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("job sizes must be positive")
    return values


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


def _max_scale(text: str) -> float:
    """``--max-scale``: ``curve`` (or 0) is bounded by the throughput curve only; K >= 1 caps at K x."""
    if text.strip().lower() == "curve":
        return 0.0
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad --max-scale {text!r} (use curve, or a multiple of the request >= 1)"
        ) from None
    if v != 0 and not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(
            f"--max-scale must be curve (or 0), or a multiple >= 1: {text!r}"
        )
    return v


def _fidelity(text: str) -> Fidelity:
    """``--fidelity``: a bundle of rules by name (:data:`scheduler.sim_config.FIDELITIES`)."""
    try:
        return fidelity_named(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _binder(text: str) -> StartBinder:
    """``--binder``: a start binder by name (:data:`scheduler.sim_config.BINDERS`)."""
    try:
        return binder_named(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _priority_share(text: str) -> dict[str, float]:
    try:
        return parse_shares(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _class_ageing(text: str) -> float | None:
    try:
        return parse_ageing(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tenant_weights(text: str) -> dict[str, float]:
    try:
        return parse_weights(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _quota(text: str) -> dict[str, int]:
    try:
        return parse_quota(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _trace_arguments(p: argparse.ArgumentParser) -> None:
    """The trace to replay: its file and format, and which of its jobs to keep."""
    p.add_argument("--trace", type=Path, help="trace file (not needed for synthetic formats)")
    p.add_argument(
        "--trace-format",
        choices=("tiresias", "philly", "edl-synthetic", "poisson", "vclos-synthetic"),
        default="tiresias",
    )
    p.add_argument("--from", dest="date_from", help="philly: first submit date (YYYY-MM-DD)")
    p.add_argument("--to", dest="date_to", help="philly: end date, exclusive")
    p.add_argument("--vc", help="philly: virtual cluster id")
    p.add_argument(
        "--max-gpus", type=_positive_int, help="drop jobs asking for more GPUs than this"
    )
    p.add_argument(
        "--duration-scale", type=float, default=1.0, help="multiply durations (x10 runs)"
    )


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    """The simulated cluster: its size, fabric leaves and placement."""
    p.add_argument("--servers", type=_positive_int, required=True)
    p.add_argument("--gpus-per-server", type=_positive_int, required=True)
    p.add_argument("--leaves", type=_positive_int, default=1)
    p.add_argument("--placement", choices=PLACEMENTS, default="count")


def _type_arguments(p: argparse.ArgumentParser) -> None:
    """A mixed cluster of GPU types (:mod:`scheduler.sim_types`): one loop per type."""
    g = p.add_argument_group("GPU types (a mixed cluster; placement by count)")
    g.add_argument(
        "--cluster-types",
        help="GPUs per type, e.g. a100:48,h100:16 (the cluster's GPUs instead of --servers)",
    )
    g.add_argument("--speeds", default="", help="speed per type (1 unless named), e.g. h100:2")
    g.add_argument(
        "--gpu-mix",
        default="",
        help="share of jobs per type, e.g. a100:0.75,h100:0.25 (a trace's gpu_type column wins)",
    )


def _policy_arguments(p: argparse.ArgumentParser) -> None:
    """The policy's parameters (Tiresias's queues, elastic scale-out) and the scaling cost."""
    p.add_argument("--queue-thresholds", type=_thresholds, help="GPU-seconds, e.g. 3250,7200")
    p.add_argument(
        "--tiresias-compat",
        action="store_true",
        help="check demotion like the public Tiresias simulator (late checks; small traces)",
    )
    p.add_argument(
        "--starvation-factor",
        type=float,
        help="tiresias: promote a job that waited this many times its run time (default off)",
    )
    p.add_argument("--waiting-threshold", type=int, default=10, help="elastic: N waiting jobs")
    p.add_argument(
        "--min-fraction",
        type=float,
        default=0.5,
        help="elastic: r, fewest GPUs as share of request",
    )
    p.add_argument(
        "--max-scale",
        type=_max_scale,
        default=DEFAULT_MAX_SCALE,
        help="elastic: how far scale-out may grow a job: 'curve' (or 0) while its throughput "
        "curve still rises (EDL's R2, 'until no gain is positive'), or K: at most K x its "
        f"request, and never past where its curve stops rising (default {DEFAULT_MAX_SCALE_TEXT})",
    )
    p.add_argument("--cost", choices=("free", "stop-free", "stop-resume"), default="free")
    p.add_argument("--tick", type=float, help="also schedule every TICK seconds")
    p.add_argument("--seed", type=int, default=0)


def _synthetic_arguments(p: argparse.ArgumentParser) -> None:
    """The synthetic traces: how many jobs, their sizes and the offered load."""
    p.add_argument("--jobs", type=_positive_int, default=1000, help="poisson: number of jobs")
    p.add_argument(
        "--sizes",
        type=_sizes,
        help="vclos-synthetic: job sizes with weights 0.75^i (default 4..64 weighted .3,.25,.2,.15,.1)",
    )
    p.add_argument("--load", type=float, default=0.8, help="poisson/vclos-synthetic: offered load")
    p.add_argument(
        "--edl-mixed",
        action="store_true",
        help="edl-synthetic: durations from 10 min to 2 h, not all 1 h",
    )


def _class_and_share_arguments(p: argparse.ArgumentParser) -> None:
    """Priority classes (their share and ageing) and tenant fair share."""
    p.add_argument(
        "--priority-share",
        type=_priority_share,
        help="assign priority classes at random (seeded), e.g. high=0.1,low=0.3; rest normal "
        "(overrides a trace's priority column)",
    )
    p.add_argument(
        "--class-ageing",
        type=_class_ageing,
        default=CLASS_AGEING_S,
        help="a queued low-class job counts as normal after waiting this long since it last "
        f"ran (seconds, 30m, 12h, 1d; off: strict classes; default {CLASS_AGEING_S:g} s)",
    )
    p.add_argument(
        "--tenant-weights",
        type=_tenant_weights,
        help="turn tenant fair share on, e.g. a=2,b=1; if the trace's tenants are not all "
        "named, every job gets one of these tenants at random (seeded)",
    )
    p.add_argument(
        "--half-life",
        type=float,
        default=FAIR_SHARE_HALF_LIFE,
        help="fair share: usage half-life in seconds (default 7 days)",
    )
    p.add_argument(
        "--quota",
        type=_quota,
        help="tenant GPU quotas, e.g. a=8,b=16: a queued job waits while its tenant's jobs "
        "hold its quota, and a higher class may stop its own tenant's lower classes to fit "
        "(tenants not named: no quota)",
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """What the run writes: the time series step, JSON, the report and the CSVs."""
    p.add_argument("--sample-every", type=float, default=60.0, help="time series step, seconds")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip")
    p.add_argument("--json", action="store_true", help="print JSON only (no progress bar)")
    p.add_argument("--report", type=Path, help="write a self-contained Plotly HTML report")
    p.add_argument("--jobs-csv", type=Path, help="write per-job results as CSV")
    p.add_argument(
        "--series-csv", type=Path, help="write the time series (busy, efficiency, queue) as CSV"
    )


def _fabric_arguments(p: argparse.ArgumentParser) -> None:
    """Fabric traffic, the Philly mapping of the vClos studies and the vClos binding."""
    # Fabric traffic and the Philly mapping of the vClos studies (issue 17).
    p.add_argument(
        "--min-gpus", type=_positive_int, default=1, help="philly: keep jobs of at least this many"
    )
    p.add_argument(
        "--gpu-scale",
        type=_positive_int,
        default=1,
        help="philly: multiply every kept job's GPUs (4 maps Philly's 1-128 onto vClos's 4-512)",
    )
    p.add_argument(
        "--traffic",
        choices=TRAFFIC,
        default="ring",
        help="ecmp: every job runs ring all-reduce (ring), or each job its model's collective "
        "(mix: ring, hierarchical ring, halving-doubling, all-to-all for moe; vclos-synthetic "
        "then also draws the moe model)",
    )
    p.add_argument(
        "--fidelity",
        type=_fidelity,
        default=IDEAL,
        metavar="|".join(FIDELITIES),
        help="which rules the loop follows where the simulator and the live tick differ: "
        "ideal (the simulator's own: refusals after the pass, a second round around them) or "
        "live-tick (what the runtime owns shown to the policy, one binding round per tick)",
    )
    p.add_argument(
        "--binder",
        type=_binder,
        metavar="|".join(BINDERS),
        help="vclos: how a start that fits no shape is bound (default: the fidelity's, "
        "base-then-extras: base first, placed before the jobs shrunk for it); "
        "base-then-extras-shrinks-kept is the binder of 2026-12-03 21:52 to 2026-12-04 03:55, "
        "whole-start-shrinks-kept the one before",
    )


def _common(p: argparse.ArgumentParser) -> None:
    """The arguments ``simulate`` and ``compare`` share, in the order ``--help`` lists them."""
    _trace_arguments(p)
    _cluster_arguments(p)
    _type_arguments(p)
    _policy_arguments(p)
    _synthetic_arguments(p)
    _class_and_share_arguments(p)
    _output_arguments(p)
    _fabric_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and --help)."""
    parser = _Parser(
        prog="python -m scheduler",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run one policy", epilog=EPILOG)
    _common(sim)
    sim.add_argument("--policy", choices=tuple(REGISTRY), default="tiresias")
    cmp_ = sub.add_parser("compare", help="run several policies on the same trace", epilog=EPILOG)
    _common(cmp_)
    cmp_.add_argument(
        "--policies", default="fifo,tiresias,elastic-tiresias", help="comma-separated"
    )
    return parser


def load_trace(args: argparse.Namespace, total_gpus: int) -> LoadedTrace:
    """The trace the arguments name, filtered to jobs that fit the cluster."""
    limit = min(args.max_gpus or total_gpus, total_gpus)
    fmt = args.trace_format
    if fmt in ("tiresias", "philly") and args.trace is None:
        raise UsageError(f"--trace is required for --trace-format {fmt}")
    if args.duration_scale <= 0:
        raise UsageError("--duration-scale must be positive")
    if (
        args.trace is not None
        and not args.trace.exists()
        and shared_trace(args.trace.name).exists()
    ):
        args.trace = shared_trace(args.trace.name)  # a bare name means the shared data folder
    if fmt == "tiresias":
        return load_tiresias(
            args.trace, duration_scale=args.duration_scale, max_gpus=limit, on_error=args.on_error
        )
    if fmt == "philly":
        return load_philly(
            args.trace,
            start=args.date_from,
            end=args.date_to,
            vc=args.vc,
            max_gpus=limit,
            seed=args.seed,
            on_error=args.on_error,
            min_gpus=args.min_gpus,
            gpu_scale=args.gpu_scale,
        )
    if fmt == "edl-synthetic":
        return edl_synthetic(seed=args.seed, mixed=args.edl_mixed)
    if fmt == "vclos-synthetic":
        models = MIX_MODELS if args.traffic == "mix" else ("vgg16", "resnet50", "resnet101", "bert")
        if args.sizes is None:
            return vclos_workload(
                jobs=args.jobs, total_gpus=total_gpus, load=args.load, seed=args.seed, models=models
            )
        return vclos_workload(
            jobs=args.jobs,
            total_gpus=total_gpus,
            load=args.load,
            sizes=args.sizes,
            size_weights=None,
            seed=args.seed,
            models=models,
        )
    return poisson_workload(jobs=args.jobs, total_gpus=total_gpus, load=args.load, seed=args.seed)


def with_priorities_and_tenants(trace: LoadedTrace, args: argparse.Namespace) -> LoadedTrace:
    """The trace with ``--priority-share`` priorities and ``--tenant-weights`` tenants applied.

    Priorities are drawn with ``--seed``; tenants are kept when every job's
    tenant is named in the weights, else each job draws one of the named
    tenants uniformly (seed ``--seed + 1``, so the two draws are independent).
    """
    jobs = trace.jobs
    if args.priority_share is not None:
        prios = assign_priorities(len(jobs), args.priority_share, args.seed)
        jobs = tuple(replace(j, priority=p) for j, p in zip(jobs, prios, strict=True))
    weights = args.tenant_weights
    if weights and not all(j.tenant in weights for j in jobs):
        rng = random.Random(args.seed + 1)
        names = sorted(weights)
        jobs = tuple(replace(j, tenant=rng.choice(names)) for j in jobs)
    return LoadedTrace(jobs, trace.skipped)


def make_policy(name: str, args: argparse.Namespace) -> Any:
    """A policy from its name and the relevant options."""
    params: dict[str, Any] = {}
    if name in ("tiresias", "dlas", "elastic-tiresias"):
        if args.queue_thresholds:
            params["thresholds"] = args.queue_thresholds
        if args.tiresias_compat:
            params["compat"] = True
    if name in ("tiresias", "dlas") and args.starvation_factor is not None:
        if args.starvation_factor <= 0:
            raise UsageError("--starvation-factor must be positive")
        params["starvation_factor"] = args.starvation_factor
    if name == "elastic-tiresias":
        params["waiting_threshold"] = args.waiting_threshold
        params["r"] = args.min_fraction
    try:
        policy = get_policy(name, **params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    policy.class_ageing_s = args.class_ageing
    return policy


def run_one(name: str, trace: LoadedTrace, args: argparse.Namespace, total: int) -> SimResult:
    """Simulate one policy with the arguments' settings (placement included)."""
    return simulate(trace.jobs, make_policy(name, args), sim_config(args, total))


def sim_config(args: argparse.Namespace, total: int) -> SimConfig:
    """The simulator's settings the arguments give, for a cluster of ``total`` GPUs."""
    fabric = None
    if args.placement != "count":
        try:
            fabric = fabric_spec_for(total, args.gpus_per_server, args.leaves)
        except (ValueError, TopologyError) as exc:
            raise UsageError(f"no fabric for --placement {args.placement}: {exc}") from None
    return SimConfig(
        total_gpus=total,
        gpus_per_server=args.gpus_per_server,
        tick=args.tick,
        cost=ScalingCost(mode=args.cost.replace("-", "_")),
        max_scale=args.max_scale,
        min_fraction=args.min_fraction,
        sample_every=args.sample_every,
        progress=not args.json and sys.stderr.isatty(),
        placement=args.placement,
        fabric=fabric,
        seed=args.seed,
        traffic=args.traffic,
        tenant_weights=args.tenant_weights,
        half_life=args.half_life,
        quota=args.quota,
        fidelity=args.fidelity
        if args.binder is None
        else replace(args.fidelity, binder=args.binder),
    )


def _write_jobs_csv(results: Sequence[SimResult], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["policy", "job", "submit", "start", "end", "jct", "gpus", "duration", "model",
                    "preemptions", "scale_events", "class", "tenant", "restarts", "failed",
                    "run_time"])  # fmt: skip
        for res in results:
            for j in (*res.jobs, *res.failed):
                w.writerow([res.policy, j.id, j.submit, j.start, j.end, round(j.jct, 4), j.gpus,
                            j.duration, j.model, j.preemptions, j.scale_events,
                            CLASS_NAMES[j.klass], j.tenant, j.restarts, j.failed,
                            round(j.run_time, 4)])  # fmt: skip


def _write_series_csv(results: Sequence[SimResult], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["policy", "t", "busy_gpus", "cluster_efficiency", "queued", "running"])
        for res in results:
            s = res.series
            for row in zip(
                s["t"], s["busy"], s["efficiency"], s["queued"], s["running"], strict=False
            ):
                w.writerow([res.policy, *(round(x, 4) for x in row)])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    total = args.servers * args.gpus_per_server
    try:
        if args.servers % args.leaves:
            raise UsageError("--servers must be a multiple of --leaves")
        if args.half_life <= 0:
            raise UsageError("--half-life must be positive")
        pools = _pools(args)
        limit = min(p.gpus for p in pools) if pools else total  # a job fits any pool
        trace = with_priorities_and_tenants(load_trace(args, limit), args)
        if not trace.jobs:
            raise UsageError("no jobs left in the trace after filtering")
        names = (
            [args.policy]
            if args.command == "simulate"
            else [n.strip() for n in args.policies.split(",") if n.strip()]
        )
        for n in names:
            if n not in REGISTRY:
                raise UsageError(f"unknown policy {n!r} (choose {', '.join(REGISTRY)})")
        if pools:
            return _run_mixed(args, trace, names, pools)
        results = [run_one(n, trace, args, total) for n in names]
    except (UsageError, TraceError) as exc:
        _err(f"error: {exc}")
        return 2
    if args.report:
        from scheduler.report import write_report

        write_report(
            results, args.report, f"{args.command}: {args.trace or args.trace_format}", total
        )
    if args.jobs_csv:
        _write_jobs_csv(results, args.jobs_csv)
    if args.series_csv:
        _write_series_csv(results, args.series_csv)
    out: dict[str, Any] = {
        "trace": str(args.trace or args.trace_format),
        "gpus": total,
        "skipped": trace.skipped,
        "results": [r.summary for r in results],
    }
    if args.json:
        one = {**results[0].summary, "skipped": trace.skipped}
        if "skipped" in results[0].summary:  # jobs the placement could never hold
            one["unplaceable"] = results[0].summary["skipped"]
        _out(json.dumps(out if len(results) > 1 else one))
    else:
        if trace.skipped_total:
            _out(f"skipped {trace.skipped_total} rows: {trace.skipped}")
        for r in results:
            s = r.summary
            line = (
                f"{s['policy']:>17}: {s['jobs']} jobs, avg JCT {s['avg_jct']:.2f} s, "
                f"median {s['median_jct']:.2f} s, p95 {s['p95_jct']:.2f} s, "
                f"queueing {s['avg_queueing_delay']:.2f} s, util {s['gpu_utilization']:.3f}, "
                f"efficiency {s['cluster_efficiency']:.3f}, makespan {s['makespan']:.0f} s"
            )
            if "mean_max_slowdown" in s:
                line += f", mean worst slowdown {s['mean_max_slowdown']:.2f}"
            _out(line)
            for group in ("by_class", "by_tenant"):
                for gname, g in s.get(group, {}).items():
                    extra = f", {g['gpu_seconds']:.0f} GPU-s" if "gpu_seconds" in g else ""
                    _out(
                        f"{'':>17}  {group[3:]} {gname}: {g['jobs']} jobs, avg JCT "
                        f"{g['avg_jct']:.2f} s, median {g['median_jct']:.2f} s, "
                        f"p95 {g['p95_jct']:.2f} s{extra}"
                    )
    return 0


def _pools(args: argparse.Namespace) -> tuple[TypePool, ...]:
    """The type pools ``--cluster-types``/``--speeds`` give (empty: one type)."""
    if not args.cluster_types:
        if args.speeds or args.gpu_mix:
            raise UsageError("--speeds and --gpu-mix need --cluster-types")
        return ()
    if args.placement != "count" or args.report or args.jobs_csv or args.series_csv:
        raise UsageError("--cluster-types replays by count and prints its figures only")
    try:
        return parse_pools(args.cluster_types, args.speeds)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_mixed(
    args: argparse.Namespace, trace: LoadedTrace, names: Sequence[str], pools: tuple[TypePool, ...]
) -> int:
    """Each policy on the mixed cluster: overall and per-type figures (JSON with --json)."""
    try:
        mix = parse_type_numbers(args.gpu_mix, "gpu mix") if args.gpu_mix else {}
        types = assign_types(trace.jobs, mix, args.seed)
        cfg = sim_config(args, sum(p.gpus for p in pools))
        summaries = {
            n: simulate_mixed(
                trace.jobs, partial(make_policy, n, args), cfg, pools, types
            ).summary()
            for n in names
        }
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        _out(json.dumps({"trace": str(args.trace or args.trace_format), "results": summaries}))
        return 0
    for n, summary in summaries.items():
        _out(f"{n:>17}: {summary['jobs']} jobs, avg JCT {summary['avg_jct']:.2f} s, "
             f"util {summary['gpu_utilization']:.3f}")  # fmt: skip
        for name, t in summary["by_type"].items():
            _out(f"{'':>17}  type {name} ({t['gpus']} GPUs x{t['speed']:g}): {t['jobs']} jobs, "
                 f"avg JCT {t['avg_jct']:.2f} s, p95 {t['p95_jct']:.2f} s, "
                 f"util {t['gpu_utilization']:.3f}")  # fmt: skip
    return 0
