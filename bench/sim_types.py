"""A mixed cluster on a Philly slice: per-type JCT and utilization under each policy (issue 38).

The cluster is pools of GPU types (``--cluster-types a100:48,h100:16``), each type's
speed against the reference (``--speeds h100:2``: compute twice as fast, the network
the same, :mod:`scheduler.throughput`); the trace's jobs get types from a seeded mix
(``--gpu-mix a100:0.75,h100:0.25``), or from a Tiresias-format trace's ``gpu_type``
column (``--trace``; the mix types the rest).  The same jobs on a uniform cluster of the same
GPU count at speed 1 (``--baseline``) say what the faster quarter buys.  Runs
:func:`scheduler.sim_types.simulate_mixed`; the last line is one JSON object.

    .venv/bin/python bench/sim_types.py --vc 6214e9 --from 2017-10-09 --to 2017-10-16 \\
        --cluster-types a100:48,h100:16 --speeds h100:2 --gpu-mix a100:0.75,h100:0.25
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.gpu_types import parse_type_numbers
from scheduler.policies import get_policy
from scheduler.sim_types import TypePool, assign_types, parse_pools, simulate_mixed
from scheduler.simulator import SimConfig
from scheduler.traces import load_philly, load_tiresias, shared_trace


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cluster-types", default="a100:48,h100:16")
    parser.add_argument("--speeds", default="h100:2")
    parser.add_argument("--gpu-mix", default="a100:0.75,h100:0.25")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument(
        "--trace",
        default="",
        help="a Tiresias-format CSV (may have a gpu_type "
        "column; jobs without one get the mix's); default: the Philly slice",
    )
    parser.add_argument("--vc", default=None)
    parser.add_argument("--from", dest="start", default="2017-10-09")
    parser.add_argument("--to", dest="end", default="2017-10-16")
    parser.add_argument("--policies", default="tiresias,elastic-tiresias")
    parser.add_argument("--max-scale", type=float, default=2.0, help="0: bounded by the curve")
    parser.add_argument("--baseline", action="store_true", help="also all GPUs of speed 1")
    return parser


def main() -> int:
    """Run the study and print a table per policy, then the JSON."""
    args = _parser().parse_args()
    try:
        pools = parse_pools(args.cluster_types, args.speeds)
        mix = parse_type_numbers(args.gpu_mix, "gpu mix")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(p.gpus for p in pools)
    smallest = min(p.gpus for p in pools)
    if args.trace:
        trace = load_tiresias(args.trace, max_gpus=smallest)
    else:
        trace = load_philly(shared_trace("philly.csv"), max_gpus=smallest,
                            vc=args.vc, start=args.start, end=args.end)  # fmt: skip
    types = assign_types(trace.jobs, mix, args.seed)
    figures: dict[str, object] = {"jobs": len(trace.jobs), "skipped": trace.skipped,
                                  "pools": [[p.name, p.gpus, p.speed] for p in pools]}  # fmt: skip
    runs: list[tuple[str, tuple[TypePool, ...], dict[str, str]]] = [("mixed", pools, types)]
    if args.baseline:
        runs.append(("uniform", (TypePool("ref", total),), dict.fromkeys(types, "ref")))
    for name in args.policies.split(","):
        for label, run_pools, run_types in runs:
            t = time.perf_counter()
            cfg = SimConfig(total_gpus=total, max_scale=args.max_scale, sample_every=3600.0)
            result = simulate_mixed(
                trace.jobs, functools.partial(get_policy, name), cfg, run_pools, run_types
            )
            summary = result.summary()
            figures[f"{name}/{label}"] = summary
            print(f"{name} ({label}, {time.perf_counter() - t:.1f} s): avg JCT {summary['avg_jct']:.0f} s, "
                  f"GPU util. {summary['gpu_utilization']:.3f}")  # fmt: skip
            for tname, s in summary["by_type"].items():
                print(f"    {tname:>6} {s['gpus']:>5} GPUs x{s['speed']:g}: {s['jobs']:>6} jobs, "
                      f"avg JCT {s['avg_jct']:>10.0f}, p95 {s['p95_jct']:>10.0f}, util. {s['gpu_utilization']:.3f}")  # fmt: skip
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
