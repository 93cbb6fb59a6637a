"""Golden outputs of the trace simulator: a battery of runs, every figure, one SHA-256.

For refactors of :mod:`scheduler.simulator` that must not change a single result.
Each case runs :func:`scheduler.simulator.simulate` and reduces its whole
:class:`~scheduler.simulator.SimResult` (every job's and failed job's fields,
the time series, the summary; floats as ``repr``, exact) to canonical JSON and
a SHA-256.  The golden file keeps one SHA per case and the SHA of them all, so a
change says which case moved.

    .venv/bin/python bench/sim_golden.py              # check against bench/sim_golden/golden.json
    .venv/bin/python bench/sim_golden.py --write      # (re)write the golden file
    .venv/bin/python bench/sim_golden.py --dump DIR   # also each case's full JSON (to diff)
    .venv/bin/python bench/sim_golden.py --only philly   # the cases whose name contains this

The battery: every policy on every placement over a slice of the Philly trace
(``../shared/data/philly.csv``), with elastic scale-out bounded by the curve
too; a seeded Poisson workload with tenants (fair share), priorities (class
ageing), failing programs (retries), run-time limits, a tick and a scaling cost
mode each; collective traffic mixes on the fabric placements; EDL's synthetic
trace elastic with stop-free costs; every saved live run in
``bench/sim_vs_real_runs/`` replayed as ``bench/sim_vs_real.py --replay`` does,
under every model of its ablation (each fidelity rule either way, the control
plane's delays, suspect GPUs, fixed costs, measured curves) and with its traced
placement (``--timeline``); the latest run's full model again with each boolean
``SimConfig`` knob flipped and each ``Fidelity`` rule turned (cases named by the
flag each rule once was), on the count placement, and with a progress bar;
``bench/forecast_accuracy.py``'s replay; and
``portal.whatif.compare`` (with Django's test settings; skipped with
``--no-django``).  ``scheduler.forecast`` itself does not call the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import scheduler.simulator as simulator_module  # noqa: E402
from fabric.topology import FabricSpec  # noqa: E402
from scheduler.fabric_placement import fabric_spec_for  # noqa: E402
from scheduler.policies import REGISTRY, get_policy  # noqa: E402
from scheduler.sim_config import (  # noqa: E402
    BindingRounds,
    Fidelity,
    LeaversSlots,
    StartUpScaleIn,
)
from scheduler.simulator import Outage, ScalingCost, SimConfig, SimResult  # noqa: E402
from scheduler.traces import (  # noqa: E402
    TraceJob,
    edl_synthetic,
    load_philly,
    poisson_workload,
    shared_trace,
    vclos_workload,
)

GOLDEN = ROOT / "bench" / "sim_golden" / "golden.json"
RUNS = ROOT / "bench" / "sim_vs_real_runs"
PLACEMENTS = ("count", "consolidated", "vclos", "ecmp")
SIMULATE = simulator_module.simulate  # the real one (the replays' calls are recorded around it)


def canon(value: Any) -> Any:
    """``value`` as plain JSON, floats as their exact ``repr`` and mappings by sorted key."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canon(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): canon(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    return repr(value)


def result_json(result: SimResult) -> Any:
    """Everything a run returns, canonical (``JobResult.jct`` included: it is a figure too)."""
    out = canon(result)
    for name in ("jobs", "failed"):
        for row, job in zip(out[name], getattr(result, name), strict=True):
            row["jct"] = repr(job.jct)
    return out


Case = tuple[str, Callable[[], Any]]


def philly_slice(jobs: int = 300, gpus: int = 32) -> list[TraceJob]:
    """The first ``jobs`` jobs of 2017-10-02 in the Philly trace, at most ``gpus`` GPUs each."""
    loaded = load_philly(
        shared_trace("philly.csv"), start="2017-10-02", end="2017-10-03", max_gpus=gpus
    )
    return list(loaded.jobs[:jobs])


def philly_cases() -> Iterator[Case]:
    """Every policy on every placement, and elastic scale-out bounded by the curve."""
    trace = philly_slice()
    spec = fabric_spec_for(32, 8, 4)
    for name in REGISTRY:
        for placement in PLACEMENTS:
            cfg = SimConfig(
                total_gpus=32,
                placement=placement,
                fabric=None if placement == "count" else spec,
                seed=3,
                sample_every=600.0,
            )
            yield f"philly/{name}/{placement}", _run(trace, name, cfg)
        curve = SimConfig(total_gpus=32, elastic=True, max_scale=0.0, sample_every=600.0)
        yield f"philly/{name}/elastic-curve", _run(trace, name, curve)


def _run(trace: list[TraceJob], policy: str, cfg: SimConfig, **params: Any) -> Callable[[], Any]:
    def run() -> Any:
        return result_json(SIMULATE(trace, get_policy(policy, **params), cfg))

    return run


def rich_trace() -> list[TraceJob]:
    """A seeded Poisson workload with tenants, priorities, failing programs and limits."""
    base = poisson_workload(jobs=160, total_gpus=32, load=1.1, seed=11).jobs
    models = ("resnet50", "vgg16", "bert", "")
    out = []
    for i, job in enumerate(base):
        out.append(
            replace(
                job,
                model=models[i % 4],
                tenant=("a", "b", "c")[i % 3],
                priority=(10, 50, 90, None)[i % 4],
                fail_after=job.duration * 0.4 if i % 7 == 0 else None,
                max_restarts=i % 3 if i % 7 == 0 else 0,
                max_runtime=job.duration * 0.7 if i % 11 == 0 else None,
            )
        )
    return out


def rich_cases() -> Iterator[Case]:
    """Fair share, priorities with class ageing, retries, limits, a tick and each cost mode."""
    trace = rich_trace()
    weights = {"a": 2.0, "b": 1.0, "c": 0.5}
    for name in REGISTRY:
        for mode in ("free", "stop_resume", "stop_free"):
            cfg = SimConfig(
                total_gpus=32,
                tick=900.0,
                cost=ScalingCost(mode, restart_s=30.0, broadcast_s=2.0),
                tenant_weights=weights,
                half_life=3600.0,
                sample_every=300.0,
            )
            yield f"rich/{name}/{mode}", _aged(trace, name, cfg, 7200.0)
        plain = SimConfig(total_gpus=32, sample_every=300.0)
        yield f"rich/{name}/plain", _aged(trace, name, plain, None)
        costs = ScalingCost(
            "stop_free",
            first_start_s=20.0,
            first_start_by_model={"bert": 60.0},
            finish_s=5.0,
            join_s=8.0,
            leave_s=4.0,
        )
        fixed = SimConfig(
            total_gpus=32,
            cost=costs,
            elastic=True,
            slot_slowdown=tuple(1.0 + 0.02 * b for b in range(33)),
            start_slowdown=tuple(1.0 + 0.05 * b for b in range(33)),
            grow_min_left_s=120.0,
            arrival_s=1.5,
            release_s=3.0,
            fidelity=Fidelity(
                leavers=LeaversSlots.BUSY_UNTIL_GONE,
                start_up_scale_in=StartUpScaleIn.AFTER_START_UP,
            ),
        )
        yield f"rich/{name}/fixed-costs", _aged(trace, name, fixed, None)
        outages = (Outage(100.0, 5000.0, 3), Outage(2000.0, 9000.0, -1, trace[5].id))
        for placement in ("count", "vclos"):
            out = SimConfig(
                total_gpus=32,
                placement=placement,
                fabric=None if placement == "count" else fabric_spec_for(32, 8, 4),
                outages=outages,
            )
            yield f"rich/{name}/outages-{placement}", _aged(trace, name, out, None)


def _aged(
    trace: list[TraceJob], policy: str, cfg: SimConfig, ageing: float | None
) -> Callable[[], Any]:
    def run() -> Any:
        pol = get_policy(policy)
        pol.class_ageing_s = ageing
        return result_json(SIMULATE(trace, pol, cfg))

    return run


def fabric_cases() -> Iterator[Case]:
    """Collective traffic mixes and seeds on the fabric placements; EDL's synthetic trace."""
    spec = FabricSpec(leaves=4, spines=4, servers_per_leaf=4, gpus_per_server=4)
    trace = list(vclos_workload(jobs=60, total_gpus=64, load=1.0, seed=5).jobs)
    for name in ("fifo", "tiresias", "elastic-tiresias"):
        for placement in ("vclos", "ecmp", "consolidated"):
            for traffic in ("ring", "mix"):
                cfg = SimConfig(
                    total_gpus=64,
                    gpus_per_server=4,
                    placement=placement,
                    fabric=spec,
                    seed=2,
                    traffic=traffic,
                )
                yield f"fabric/{name}/{placement}/{traffic}", _run(trace, name, cfg)
    edl = list(edl_synthetic(seed=0).jobs)
    stop_free = SimConfig(total_gpus=32, max_scale=2, cost=ScalingCost("stop_free"))
    yield "edl/elastic-stop-free", _run(edl, "elastic-tiresias", stop_free, waiting_threshold=0)
    yield "edl/fifo", _run(edl, "fifo", SimConfig(total_gpus=32))
    mixed = list(edl_synthetic(seed=1, mixed=True).jobs)
    yield (
        "edl/mixed-stop-resume",
        _run(mixed, "elastic-tiresias", SimConfig(total_gpus=32, cost=ScalingCost("stop_resume"))),
    )


def replay_cases() -> Iterator[Case]:
    """Every saved live run replayed under every model of ``bench/sim_vs_real.py``'s ablation."""
    from bench import sim_vs_real as svr

    trace_all = json.loads(svr.TRACE.read_text())
    for path in sorted(RUNS.glob("*.json")):
        real = json.loads(path.read_text())
        trace = [job for job in trace_all if job["name"] in real]
        measured = svr.measure(trace, real)
        for model in svr.MODELS:
            yield f"replay/{path.stem}/{model.name}", _replay(svr, trace, measured, model)
        yield f"replay/{path.stem}/traced", _replay(svr, trace, measured, svr.MODELS[0], True)


def _replay(svr: Any, trace: Any, measured: Any, model: Any, traced: bool = False) -> Any:
    def run() -> Any:
        calls: list[Any] = []
        trail: list[Any] | None = [] if traced else None
        with _recording(calls):
            per_job, figures = svr.simulate_trace(trace, measured, "elastic-tiresias", model, trail)
        return {
            "per_job": canon(per_job),
            "figures": canon(figures),
            "trail": canon(trail),
            "results": [result_json(r) for r in calls],
        }

    return run


class _recording:
    """``scheduler.simulator.simulate`` replaced by one that keeps every result in ``calls``."""

    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    def __enter__(self) -> None:
        def recorded(*args: Any, **kwargs: Any) -> SimResult:
            result = SIMULATE(*args, **kwargs)
            self.calls.append(result)
            return result

        simulator_module.simulate = recorded  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        simulator_module.simulate = SIMULATE


def flag_cases() -> Iterator[Case]:
    """The latest saved run's full model with each boolean ``SimConfig`` knob flipped and each
    fidelity rule turned the other way."""
    from bench import sim_vs_real as svr

    path = sorted(RUNS.glob("*.json"))[-1]
    real = json.loads(path.read_text())
    trace = [job for job in json.loads(svr.TRACE.read_text()) if job["name"] in real]
    captured: list[tuple[Any, ...]] = []

    def capture(rows: Any, policy: Any, cfg: SimConfig, **kw: Any) -> SimResult:
        captured.append((rows, policy, cfg))
        return SIMULATE(rows, policy, cfg, **kw)

    simulator_module.simulate = capture  # type: ignore[assignment]
    try:
        svr.simulate_trace(trace, svr.measure(trace, real), "elastic-tiresias", svr.MODELS[0])
    finally:
        simulator_module.simulate = SIMULATE
    rows, policy, base = captured[0]
    variants: list[tuple[str, SimConfig]] = [("base", base)]
    variants += [(f"flip-{n}", replace(base, **{n: not getattr(base, n)})) for n in FLAGS]
    variants += [(f"flip-{n}", replace(base, fidelity=f)) for n, f in _turned(svr, base.fidelity)]
    variants.append(("count", replace(base, placement="count", fabric=None)))
    variants.append(("count-no-outages", replace(base, placement="count", outages=())))
    whole = svr.binder_with(starts_on_base=False, reshapes=base.fidelity.binder.reshapes)
    one_pass = replace(base.fidelity, rounds=BindingRounds.ONCE_PER_TICK, binder=whole)
    variants.append(("one-pass-whole", replace(base, fidelity=one_pass)))
    for name, cfg in variants:
        yield f"flags/{path.stem}/{name}", _same(rows, policy, cfg)


FLAGS = ("elastic", "progress")
"""``SimConfig``'s boolean knobs, each flipped in a case of its own."""


def _turned(svr: Any, fid: Fidelity) -> list[tuple[str, Fidelity]]:
    """``fid`` with each rule turned the other way, named by the ``SimConfig`` flag each
    rule once was (the golden file keeps those names)."""

    def other(rule: Any) -> Any:
        return next(r for r in type(rule) if r is not rule)

    binder = fid.binder
    return [
        ("second_pass", replace(fid, rounds=other(fid.rounds))),
        ("leavers_busy", replace(fid, leavers=other(fid.leavers))),
        ("leave_follows_start", replace(fid, start_up_scale_in=other(fid.start_up_scale_in))),
        ("ending_caps_policy", replace(fid, ending=other(fid.ending))),
        ("switching_pins_policy", replace(fid, switching=other(fid.switching))),
        (
            "refuse_whole_start",
            replace(
                fid,
                binder=svr.binder_with(
                    starts_on_base=not binder.starts_on_base, reshapes=binder.reshapes
                ),
            ),
        ),
        (
            "reshape_reclaims",
            replace(
                fid,
                binder=svr.binder_with(
                    starts_on_base=binder.starts_on_base, reshapes=not binder.reshapes
                ),
            ),
        ),
    ]


def _same(rows: Any, policy: Any, cfg: SimConfig) -> Callable[[], Any]:
    def run() -> Any:
        return result_json(SIMULATE(rows, policy, cfg))

    return run


def whatif_cases() -> Iterator[Case]:
    """``portal.whatif.compare`` (Django's test settings): every policy, three placements."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.test")
    import django

    django.setup()
    from portal import whatif

    trace = tuple(philly_slice(jobs=120, gpus=16))
    params = {
        "total_gpus": 16,
        "gpus_per_server": 4,
        "leaves": 2,
        "elastic": True,
        "policies": list(REGISTRY),
        "placements": ["count", "vclos", "ecmp"],
    }

    def run() -> Any:
        calls: list[Any] = []
        original = whatif.simulate

        def recorded(*args: Any, **kwargs: Any) -> SimResult:
            result = original(*args, **kwargs)
            calls.append(result)
            return result

        whatif.simulate = recorded
        try:
            report = whatif.compare(trace, params, on_progress=lambda _f, _w: None)
        finally:
            whatif.simulate = original
        return {"report": canon(report), "results": [result_json(r) for r in calls]}

    yield "whatif/compare", run


def forecast_cases() -> Iterator[Case]:
    """``bench/forecast_accuracy.py``: the replay it predicts against (its policy watches the
    core mid-run).  Its accuracy figures are left out: they follow ``scheduler.forecast``."""
    from bench import forecast_accuracy as fa

    # 60_job.csv only: its Philly mode forecasts for minutes.
    yield "forecast_accuracy/60_job", _forecast(fa, ["--scale", "10", "--gpus", "8"])


def _forecast(fa: Any, argv: list[str]) -> Callable[[], Any]:
    def run() -> Any:
        calls: list[Any] = []
        original = fa.simulate

        def recorded(*args: Any, **kwargs: Any) -> SimResult:
            result = original(*args, **kwargs)
            calls.append(result)
            return result

        out = io.StringIO()
        fa.simulate, sys.argv = recorded, ["forecast_accuracy.py", *argv]
        try:
            with contextlib.redirect_stdout(out):
                fa.main()
        finally:
            fa.simulate, sys.argv = original, [sys.argv[0]]
        return [result_json(r) for r in calls]

    return run


def progress_cases() -> Iterator[Case]:
    """A run with the progress bar on (it draws on stderr; the figures must not move)."""
    trace = philly_slice(jobs=150)
    cfg = SimConfig(total_gpus=32, progress=True)
    yield "progress/tiresias", _run(trace, "tiresias", cfg)


def all_cases(django: bool) -> Iterator[Case]:
    """The whole battery, in a fixed order."""
    yield from philly_cases()
    yield from rich_cases()
    yield from fabric_cases()
    yield from replay_cases()
    yield from flag_cases()
    yield from forecast_cases()
    yield from progress_cases()
    if django:
        yield from whatif_cases()


def digest(value: Any) -> tuple[str, str]:
    """Canonical JSON text of ``value`` and its SHA-256."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()


def main() -> int:
    """Run the battery; write or check the golden file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the golden file")
    parser.add_argument("--dump", type=Path, help="write each case's full JSON under this folder")
    parser.add_argument("--only", default="", help="only the cases whose name contains this")
    parser.add_argument("--no-django", action="store_true", help="leave out portal.whatif")
    args = parser.parse_args()
    began = time.perf_counter()
    shas: dict[str, str] = {}
    for name, run in all_cases(django=not args.no_django):
        if args.only not in name:
            continue
        text, sha = digest(run())
        shas[name] = sha
        if args.dump:
            out = args.dump / (name.replace("/", "__").replace(" ", "_") + ".json")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
    _, total = digest(shas)
    print(f"{len(shas)} cases in {time.perf_counter() - began:.1f} s; SHA-256 {total}")
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"sha256": total, "cases": shas}, indent=1) + "\n")
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
        return 0
    if not GOLDEN.exists():
        return 0
    golden = json.loads(GOLDEN.read_text())
    moved = [n for n, sha in shas.items() if golden["cases"].get(n) != sha]
    for name in moved:
        print(f"CHANGED: {name}")
    if args.only or args.no_django:
        return 1 if moved else 0
    if total != golden["sha256"]:
        print(f"golden SHA-256 {golden['sha256']}: DIFFERENT")
        return 1
    print("identical to the golden file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
