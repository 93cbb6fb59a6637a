"""Benchmark: the whole Philly trace (82,247 jobs) on 2,048 GPUs with tiresias and elastic-tiresias.

Target (issue 18): at most 10 s per policy on a quiet 2-core machine.  Prints each run's
wall time and CPU time (``time.process_time``: what a quiet machine's wall time would be, as
the run is single-threaded), jobs/s, peak memory (the process's peak RSS so far, from
getrusage) and the ratio of the CPU time to the 10 s target; the last line is one JSON
object with all figures.  Elastic-Tiresias runs with the command line's default scale-out
bound (``--max-scale curve``), or ``--max-scale K``.

    .venv/bin/python bench/simulator.py            # both policies, whole trace
    .venv/bin/python bench/simulator.py --quick    # one week only (a smoke run)
    .venv/bin/python bench/simulator.py --placement vclos   # fabric-aware (16 leaves)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.fabric_placement import SIM_PLACEMENTS, fabric_spec_for
from scheduler.policies import get_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import load_philly, shared_trace

TARGET_S = 10.0


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one week of the trace only")
    parser.add_argument("--gpus", type=int, default=2048)
    parser.add_argument("--placement", choices=SIM_PLACEMENTS, default="count")
    parser.add_argument("--leaves", type=int, default=16, help="fabric leaves (not for count)")
    parser.add_argument("--max-scale", type=float, default=0.0, help="0: bounded by the curve")
    args = parser.parse_args()
    fabric = None
    if args.placement != "count":
        fabric = fabric_spec_for(args.gpus, 8, args.leaves)
    t0 = time.perf_counter()
    trace = load_philly(
        shared_trace("philly.csv"),
        max_gpus=args.gpus,
        start="2017-10-02" if args.quick else None,
        end="2017-10-09" if args.quick else None,
    )
    load_s = time.perf_counter() - t0
    print(f"loaded {len(trace.jobs)} jobs in {load_s:.2f} s (skipped {trace.skipped})")
    figures: dict[str, object] = {"jobs": len(trace.jobs), "gpus": args.gpus, "load_s": round(load_s, 3),
                                  "target_s": TARGET_S, "placement": args.placement}  # fmt: skip
    for name in ("tiresias", "elastic-tiresias"):
        t, cpu = time.perf_counter(), time.process_time()
        cfg = SimConfig(
            total_gpus=args.gpus,
            sample_every=3600.0,
            placement=args.placement,
            fabric=fabric,
            max_scale=args.max_scale,
        )
        res = simulate(trace.jobs, get_policy(name), cfg)
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        jobs_per_s = len(trace.jobs) / wall
        ratio = cpu / TARGET_S
        print(
            f"{name:>17}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, {jobs_per_s:8.0f} jobs/s, "
            f"peak RSS {peak / 2**20:6.1f} MiB, {ratio:.3f} x target, "
            f"avg JCT {res.summary['avg_jct']:.0f} s"
        )
        figures[name] = {
            "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "jobs_per_s": round(jobs_per_s, 1),
            "peak_rss_mib": round(peak / 2**20, 1),
            "ratio_to_target": round(ratio, 4),
            "avg_jct": res.summary["avg_jct"],
        }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
