"""Benchmark: the scheduler tick, incremental and full rebuild, in PostgreSQL.

    python bench/tick.py [--jobs 1000] [--gpus 2048] [--ticks 30] [--policy elastic-tiresias]
                         [--churn 5] [--database-url URL] [--profile FILE]
    python bench/tick.py --sizes 1000,2000,5000,10000 [--ticks 15] [--database-url URL]
    python bench/tick.py --gpu-types 3 [--jobs 1000]   # a mixed cluster (issue 38)

Builds a fresh database (``bench_tick`` on the local PostgreSQL by default), a
fabric of ``--gpus / 32`` leaves x 32 GPUs (4 servers of 8 GPUs per leaf, 32
spines; 2,048 GPUs = 64 leaves, 16,384 GPUs = 512 leaves: 2,048 servers x 8),
``--jobs`` jobs with sizes drawn from the Philly trace, places them with
initial ticks (three, then more until one changes nothing: a steady cluster),
then measures ticks under churn: between ticks a few jobs finish
(through the real report handler) and new ones arrive (through the real
submission service).  The measured ticks alternate, in blocks of ``BLOCK``,
between the incremental tick (state kept in this process,
``TICK_INCREMENTAL=1``) and a tick that rebuilds everything from the database
(``TICK_INCREMENTAL=0``), each after the same churn, so both are measured in
the same run on the same load.  A block's first tick is not measured: the kept
state has not seen the other mode's last round, so an incremental tick there
would read two rounds of churn and the full rebuild's writes (alternating tick
by tick, as until 2026-12-03, gave every incremental tick twice the issue's
churn).  Each tick's time includes every database query and the commit.

The initial jobs are written in bulk (rows as ``do_submit_job`` writes them:
the job, its ``submitted`` and ``queued`` events); only the churn goes through
the services.  The setup is not what is measured, and at 10,000 jobs one
service call per job would take minutes.

``--sizes 1000,2000,5000,10000`` runs one such benchmark per size, each in its
own process and database (``N:G`` names the GPUs; by default 1,000 jobs on
2,048 GPUs, 2,000 on 4,096, 5,000 on 8,192, 10,000 on 16,384), and prints the
growth table.  ``--profile FILE`` adds ``--ticks`` more incremental churn ticks
under cProfile (stats written to FILE) and prints where their time and their
queries went.

The incremental tick takes its policy from its source (``source.policy(name)``: the
policy core kept between ticks, ``scheduler.policies.kept``; on a typed cluster one
kept core per GPU-type pool, ``scheduler.policies.kept_typed``, so
``kept_policy_rebuilds`` is then the number of types); the full rebuild's is a fresh
core every tick (per pool on a typed cluster).  ``--policy-core fresh`` gives the incremental tick a fresh
core too (the figures before the core was kept).

Targets (issue 37): incremental p95 <= 25 ms at 1,000 jobs on 2,048 GPUs, <= 60 ms
at 10,000 jobs on 16,384, each <= 1/3 of the full rebuild's p95 in the same run.
The last line is one JSON object with the figures (``tick_p95_ms``,
``full_rebuild_p95_ms``, ``active_jobs``, their ratio; with ``--sizes``, those of
the largest size and a ``growth`` list of every size's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.tick_phases import PhaseTimer  # noqa: E402

TARGETS_P95_MS = {2048: 25.0, 16384: 60.0}  # issue 37, by GPUs
TARGET_RATIO = 1 / 3  # issue 37: incremental p95 at most a third of the full rebuild's
GPUS_PER_LEAF = 32  # 4 servers of 8 GPUs, as the fabric the figures were first taken on
SPINES = 32
SETTLE_TICKS_MAX = 30
BLOCK = 6
"""Measured ticks run in blocks of this many of one mode, then of the other (the first not measured)."""
DEFAULT_GPUS = {1000: 2048, 2000: 4096, 5000: 8192, 10000: 16384}
"""GPUs for ``--sizes`` entries that name none: the issue's two points and the sizes between."""


def _prepare_database(url: str) -> None:
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _philly_pool() -> list[int]:
    """Job sizes (1-32 GPUs) of the Philly trace, in file order."""
    from scheduler.traces import shared_trace

    sizes: list[int] = []
    with open(shared_trace("philly.csv")) as trace:
        next(trace)
        for line in trace:
            parts = line.split(",")
            if len(parts) >= 3 and parts[2].strip().isdigit() and 1 <= int(parts[2]) <= 32:
                sizes.append(int(parts[2]))
    return sizes


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return statistics.median(ms), p95, ms[-1]


def _job_fields(size: int, gpu_type: str | None = None) -> dict[str, Any]:
    """One benchmark job's request: Philly size, elastic from half to twice it (of one
    GPU type when the cluster has several)."""
    return {
        "name": "b",
        "workload": "resnet18-synthetic",
        "gpus": size,
        "min_gpus": max(1, size // 2),
        "max_gpus": size * 2,
        "batch_size": 512,
        **({"gpu_types": [gpu_type]} if gpu_type else {}),
    }


GPU_TYPE_NAMES = ("a100-40g", "h100-80g", "l40s-48g", "b200-192g", "v100-32g", "a10-24g")
"""The types ``--gpu-types N`` gives the cluster (the first N)."""


def _topology(gpus: int, types: tuple[str, ...]) -> dict[str, Any]:
    """The benchmark fabric; with several ``types``, each a contiguous block of leaves."""
    leaves = gpus // GPUS_PER_LEAF
    fabric: dict[str, Any] = {
        "leaves": leaves,
        "spines": SPINES,
        "servers_per_leaf": GPUS_PER_LEAF // 8,
        "gpus_per_server": 8,
    }
    if len(types) > 1:
        per_leaf = fabric["servers_per_leaf"]
        fabric["servers"] = [
            {
                "leaf": leaf,
                "slot": slot,
                "node": f"node-{leaf * per_leaf + slot}",
                "gpu_type": types[leaf * len(types) // leaves],
            }
            for leaf in range(leaves)
            for slot in range(per_leaf)
        ]
    return fabric


_SQL_SHAPE = re.compile(r"\b(IN|VALUES) \([^)]*\)(, \([^)]*\))*|'[^']*'|\b\d+\b")


def _query_shape(sql: str) -> str:
    """A query with its literal values and id lists folded, so equal shapes count together."""
    return _SQL_SHAPE.sub("?", sql)[:160]


class Bench:
    """One benchmark database: its tenant, the size pool, and the churn between ticks."""

    def __init__(self, options: argparse.Namespace) -> None:
        from django.utils import timezone

        from inventory.models import Server
        from inventory.services import do_load_topology
        from tenancy.services import do_create_tenant

        self.options = options
        self.rng = random.Random(options.seed)
        self.pool = _philly_pool()
        self.event = 10**12
        count = getattr(options, "gpu_types", 1)
        self.types = GPU_TYPE_NAMES[:count] if count > 1 else ()
        do_load_topology(_topology(options.gpus, self.types))
        Server.objects.update(last_heartbeat=timezone.now())
        self.tenant = do_create_tenant(
            slug="bench",
            owner_username="bench",
            gpu_quota=1_000_000,
            max_queued_jobs=options.jobs + 8 * options.churn * options.ticks,
        ).tenant
        self.owner = self.tenant.memberships.get().user

    def bulk_submit(self, count: int) -> None:
        """``count`` queued jobs with the rows a submission writes (not measured: bulk)."""
        from django.db import transaction
        from django.utils import timezone

        from jobs.choices import EventKind, JobState
        from jobs.models import Job, JobEvent

        now = timezone.now()
        with transaction.atomic():
            jobs = Job.objects.bulk_create(
                [
                    Job(
                        tenant=self.tenant,
                        submitter=self.owner,
                        state=JobState.QUEUED,
                        submitted_at=now,
                        **_job_fields(size, self.some_type()),
                    )
                    for size in self.rng.choices(self.pool, k=count)
                ],
                batch_size=2000,
            )
            events = []
            for job in jobs:
                events.append(
                    JobEvent(
                        job=job,
                        at=now,
                        kind=EventKind.SUBMITTED,
                        reason="submitted by bench",
                        to_state=JobState.PENDING,
                    )
                )
                events.append(
                    JobEvent(
                        job=job,
                        at=now,
                        kind=EventKind.STATE,
                        reason="accepted: waiting for GPUs",
                        from_state=JobState.PENDING,
                        to_state=JobState.QUEUED,
                        from_parallelism=0,
                        to_parallelism=0,
                    )
                )
            JobEvent.objects.bulk_create(events, batch_size=5000)

    def some_type(self) -> str | None:
        """A type for the next job (jobs spread evenly over them); None on one type."""
        return self.rng.choice(self.types) if self.types else None

    def submit(self, size: int) -> None:
        """One job through the real submission service."""
        from jobs.services import check_job_spec, do_submit_job

        spec = check_job_spec(tenant=self.tenant, data=_job_fields(size, self.some_type()))
        do_submit_job(user=self.owner, tenant=self.tenant, spec=spec)

    def heartbeats(self) -> None:
        """Every agent reports in (outside the measured tick)."""
        from django.utils import timezone

        from inventory.models import Server

        Server.objects.update(last_heartbeat=timezone.now(), state="up")

    def churn(self) -> None:
        """``--churn`` running jobs finish (report handler), as many arrive (service)."""
        from control.reports import handle_report
        from jobs.models import Job

        running = list(Job.objects.filter(state="running").values_list("id", flat=True))
        for job_id in self.rng.sample(running, min(self.options.churn, len(running))):
            self.event += 1
            handle_report(
                {
                    "type": "finished",
                    "node": "node-0",
                    "job": f"job-{job_id}",
                    "event_id": f"{self.event}-0",
                    "step": 1,
                }
            )
        for size in self.rng.choices(self.pool, k=self.options.churn):
            self.submit(size)
        self.heartbeats()
        self.settle()

    @staticmethod
    def settle() -> None:
        """Wait until this process's after-commit threads are idle (live summaries and
        patches, agent commands).

        In production the churn's reports and submissions are handled by other
        processes (report workers, web servers), whose after-commit work never
        shares the tick process's interpreter; here they run in the bench's own,
        and the work they hand to its finisher thread would otherwise run during
        the next measured tick.
        """
        from jobs.command_sender import wait_sent
        from utilities.realtime import coalescer, wait_finished

        wait_finished()
        wait_sent()
        coalescer().wait_idle()


def _profile(bench: Bench, tick: Callable[[], Any], path: str) -> dict[str, Any]:
    """``--ticks`` incremental churn ticks under cProfile; where their time and queries go."""
    import cProfile
    import io
    import pstats

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    profiler = cProfile.Profile()
    shapes: Counter[str] = Counter()
    seconds: dict[str, float] = {}
    queries: list[int] = []
    for _ in range(bench.options.ticks):
        bench.churn()
        connection.queries_log.clear()  # the capture appends to the log: count from empty
        with CaptureQueriesContext(connection) as captured:
            profiler.enable()
            tick()
            profiler.disable()
        queries.append(len(captured.captured_queries))
        for query in captured.captured_queries:
            shape = _query_shape(query["sql"])
            shapes[shape] += 1
            seconds[shape] = seconds.get(shape, 0.0) + float(query["time"])
    profiler.dump_stats(path)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(40)
    print(out.getvalue())
    print(f"queries per tick: {queries}")
    print("per tick: queries, ms (database round trips as Django timed them), shape")
    for shape, total in sorted(seconds.items(), key=lambda item: -item[1])[:25]:
        ticks = len(queries)
        print(f"{shapes[shape] / ticks:7.1f} {total * 1000 / ticks:7.2f}  {shape}")
    return {"profile_queries_per_tick": statistics.median(queries)}


def _policy_from_source(core: str) -> str:
    """Which policy the tick gets from its source (``source.policy(name)``): the kept core
    (the default), or with ``core="fresh"`` a fresh one every tick, as before the core was
    kept (the kept state then hands out ``live_policy``, as the full rebuild does).
    Says which."""
    from control import incremental
    from control.policy import live_policy

    if core != "fresh":
        return "kept core (the tick's source.policy)"

    def fresh(self: incremental.KeptState, name: str | None = None) -> Any:
        return live_policy(name)

    incremental.KeptState.policy = fresh  # type: ignore[method-assign]
    return "fresh core every tick (live_policy)"


def run_one(options: argparse.Namespace) -> dict[str, Any]:
    """One benchmark database at ``--jobs`` / ``--gpus``; the figures as a dict."""
    _prepare_database(options.database_url)
    os.environ["DATABASE_URL"] = options.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
    os.environ["LOG_LEVEL"] = "WARNING"
    # As in production: under DEBUG every query is also formatted and logged (Django's
    # debug cursor), a cost the portal's scheduler does not pay.  ``--profile`` still sees
    # every query: it captures them explicitly.
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "bench-tick-" + "k" * 40)
    # No agents here list their processes in heartbeats: without this, reconcile would
    # requeue every job placed more than a minute ago (a slow setup on a loaded machine).
    os.environ.setdefault("RECONCILE_SECONDS", "86400")
    os.environ.setdefault("RECONCILE_START_SECONDS", "86400")
    # Nor does a silence between the bench's heartbeats mean a dead agent: a first tick
    # placing 10,000 jobs on a loaded machine outlasts the 20 s default.
    os.environ.setdefault("AGENT_DOWN_AFTER_SECONDS", "86400")
    # The first tick places every job at once (tens of seconds at 10,000): past the lock's
    # 12 s it would warn that it outlived it.
    os.environ.setdefault("TICK_LOCK_SECONDS", "600")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from control import incremental
    from control.tick import run_tick
    from jobs.models import Job

    call_command("migrate", verbosity=0)
    policy_core = _policy_from_source(options.policy_core)
    print(f"policy: {options.policy}, {policy_core}", flush=True)
    setup_start = time.perf_counter()
    bench = Bench(options)
    bench.bulk_submit(options.jobs)
    initial = []
    for _ in range(3):
        bench.heartbeats()
        initial.append(run_tick(policy=options.policy).duration_s)
    # Then until the cluster is steady (a tick with no change): the measured ticks are
    # those of a cluster that only churns, not of one still making room for its queue.
    settling = 0
    while settling < SETTLE_TICKS_MAX:
        bench.heartbeats()
        settling += 1
        if not run_tick(policy=options.policy).changed_jobs:
            break
    # What autovacuum does in a database that reached its steady state over days: placing
    # every job at once left a dead row version per job, which each tick would scan.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    active = Job.objects.filter(state__in=("running", "scaling", "queued")).count()
    running = Job.objects.filter(state__in=("running", "scaling")).count()
    setup_s = time.perf_counter() - setup_start
    print(
        f"setup {setup_s:.1f} s: {active} active jobs, {running} running; "
        f"first ticks {[round(t * 1000) for t in initial]} ms, steady after {settling} more; "
        f"load {os.getloadavg()}",
        flush=True,
    )

    durations: dict[bool, list[float]] = {True: [], False: []}
    changed: list[int] = []
    phases = PhaseTimer()
    if options.phases:
        phases.install()
    verifies_before = incremental.kept_state().verifications
    round_ = 0
    while min(len(durations[True]), len(durations[False])) < options.ticks:
        bench.churn()
        kept = (round_ // BLOCK) % 2 == 0  # blocks alternate: both modes see the same load
        settings.TICK_INCREMENTAL = kept
        measured = not (round_ % BLOCK == 0 or len(durations[kept]) == options.ticks)
        with phases.measuring(keep=kept and measured):
            result = run_tick(policy=options.policy)
        round_ += 1
        if not measured:
            continue  # a block's first tick also sees the other mode's last round: not measured
        durations[kept].append(result.duration_s)
        if kept:
            changed.append(len(result.changed_jobs))
    settings.TICK_INCREMENTAL = True
    verifications = incremental.kept_state().verifications - verifies_before
    load = os.getloadavg()
    extra: dict[str, Any] = {}
    if options.profile:
        extra = _profile(bench, lambda: run_tick(policy=options.policy), options.profile)
    active = Job.objects.filter(state__in=("running", "scaling", "queued")).count()
    connection.close()

    p50, p95, top = _percentiles(durations[True])
    full_p50, full_p95, full_top = _percentiles(durations[False])
    target = TARGETS_P95_MS.get(options.gpus)
    figures: dict[str, Any] = {
        "policy": options.policy,
        "gpu_types": getattr(options, "gpu_types", 1),
        "gpus": options.gpus,
        "jobs": options.jobs,
        "active_jobs": active,
        "ticks": len(durations[True]),
        "changed_jobs_per_tick": statistics.median(changed),
        "tick_p50_ms": round(p50, 1),
        "tick_p95_ms": round(p95, 1),
        "tick_max_ms": round(top, 1),
        "full_rebuild_p50_ms": round(full_p50, 1),
        "full_rebuild_p95_ms": round(full_p95, 1),
        "full_rebuild_max_ms": round(full_top, 1),
        "p95_ratio_incremental_to_full": round(p95 / full_p95, 3),
        "verify_passes": verifications,
        "mismatches": incremental.kept_state().mismatches,
        "target_p95_ms": target,
        "p95_vs_target": round(p95 / target, 3) if target else None,
        "target_ratio": round(TARGET_RATIO, 3),
        "targets_met": bool(target and p95 <= target and p95 <= TARGET_RATIO * full_p95),
        "policy_core": options.policy_core,
        "kept_policy_rebuilds": sum(
            kept.rebuilds for kept in incremental.kept_state().policies.values()
        ),
        "first_tick_ms": round(initial[0] * 1000, 1),
        "settling_ticks": settling,
        "setup_s": round(setup_s, 1),
        "load": [round(x, 2) for x in load],
        "incremental_ms": sorted(round(d * 1000, 1) for d in durations[True]),
        **extra,
    }
    if options.phases:
        figures["phases_ms"] = phases.medians()
        for label, median in figures["phases_ms"].items():
            print(f"  {label:24s} median {median:7.2f} ms")
    print(
        f"incremental tick p50 {p50:.1f} ms, p95 {p95:.1f} ms; full rebuild p50 "
        f"{full_p50:.1f} ms, p95 {full_p95:.1f} ms (ratio {p95 / full_p95:.2f})"
        + (f"; target {target:.0f} ms: {p95 / target:.2f}" if target else "")
        + f"; load {load}"
    )
    print(
        f"p95 {p95:.1f} ms at {active:,} jobs / {options.gpus:,} GPUs: full rebuild "
        f"{full_p95:.1f} ms, ratio {p95 / full_p95:.2f} (target <= {TARGET_RATIO:.2f})"
        + (
            f", target {target:.0f} ms: {'met' if figures['targets_met'] else 'not met'}"
            if target
            else ""
        )
    )
    return figures


def _sizes(text: str) -> list[tuple[int, int]]:
    """``1000,2000`` or ``1000:2048,...`` as (jobs, GPUs) pairs."""
    pairs = []
    for item in text.split(","):
        jobs, _, gpus = item.strip().partition(":")
        count = int(jobs)
        pairs.append((count, int(gpus) if gpus else DEFAULT_GPUS.get(count, 2048)))
    return pairs


def run_sizes(options: argparse.Namespace, pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """One benchmark process per (jobs, GPUs); the growth table and the figures of each."""
    rows: list[dict[str, Any]] = []
    for jobs, gpus in pairs:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            f"--jobs={jobs}",
            f"--gpus={gpus}",
            f"--ticks={options.ticks}",
            f"--churn={options.churn}",
            f"--policy={options.policy}",
            f"--seed={options.seed}",
            f"--policy-core={options.policy_core}",
            f"--database-url={options.database_url}",
        ]
        print(f"--- {jobs} jobs on {gpus} GPUs", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        for line in lines[:-1]:
            print(line)
        if done.returncode or not lines:
            print(done.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"the {jobs}-job run failed (exit {done.returncode})")
        rows.append(json.loads(lines[-1]))
    print()
    print("| jobs | GPUs | incremental p50 / p95 | full rebuild p50 / p95 | ratio | changed/tick |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['active_jobs']:,} | {row['gpus']:,} | {row['tick_p50_ms']} / "
            f"{row['tick_p95_ms']} ms | {row['full_rebuild_p50_ms']} / "
            f"{row['full_rebuild_p95_ms']} ms | {row['p95_ratio_incremental_to_full']} | "
            f"{row['changed_jobs_per_tick']} |"
        )
    first, last = rows[0], rows[-1]
    growth = last["tick_p50_ms"] / first["tick_p50_ms"]
    jobs_growth = last["active_jobs"] / first["active_jobs"]
    print(
        f"\nincremental p50 grew {growth:.2f}x for {jobs_growth:.1f}x the jobs "
        f"(full rebuild {last['full_rebuild_p50_ms'] / first['full_rebuild_p50_ms']:.2f}x)"
    )
    keys = ("tick_p95_ms", "full_rebuild_p95_ms", "active_jobs", "gpus", "target_p95_ms")
    return {**{key: last[key] for key in keys}, "growth": rows}


def main() -> int:
    """Parse the options, run one size or the ``--sizes`` table; the last line is JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=2048, help="a multiple of 32 (leaves x 32)")
    parser.add_argument("--sizes", help="1000,2000,5000,10000 or jobs:gpus,...: a growth table")
    parser.add_argument("--policy", default="elastic-tiresias")
    parser.add_argument("--churn", type=int, default=5, help="jobs finishing and arriving per tick")
    parser.add_argument("--profile", metavar="FILE", help="profile --ticks more ticks into FILE")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time the tick's phases (wall clock, bench/tick_phases.py): medians over the ticks",
    )
    parser.add_argument(
        "--policy-core",
        choices=("kept", "fresh"),
        default="kept",
        help="the incremental tick's policy core: kept between ticks (default), or fresh",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_tick"
        ),
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--gpu-types",
        type=int,
        default=1,
        choices=range(1, len(GPU_TYPE_NAMES) + 1),
        help="GPU types in the cluster (blocks of leaves), each job asking for one of them",
    )
    options = parser.parse_args()
    if options.sizes:
        try:
            pairs = _sizes(options.sizes)
        except ValueError:
            parser.error("--sizes takes jobs or jobs:gpus, comma-separated")
        gpus = [g for _, g in pairs]
    else:
        gpus = [options.gpus]
    if any(g < GPUS_PER_LEAF or g % GPUS_PER_LEAF for g in gpus):
        parser.error(f"GPUs must be positive multiples of {GPUS_PER_LEAF}")
    figures = run_sizes(options, pairs) if options.sizes else run_one(options)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
