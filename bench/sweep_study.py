"""Study: time to the best trial of an ASHA sweep, fixed-size trials against elastic weighted ones.

One synthetic sweep (issue 40's "the elastic scheduler feeds the sweep"):
``--trials`` trials of one model, ASHA (``scheduler.asha``: eta 3, rungs
``max_steps / eta**k``), at most ``--cluster / --gpus`` trials at once, on a
``--cluster``-GPU cluster.  Each trial's loss after ``s`` steps follows a
power law to a floor drawn per trial (its hyperparameters' quality)::

    loss_i(s) = floor_i + amp_i * (1 + s / 500) ** -alpha_i
    floor_i ~ U(0.2, 0.8), amp_i ~ U(0.5, 1.5), alpha_i ~ U(0.3, 0.9)   (seeded)

so curves cross and an early rung ranks trials imperfectly, as real ones do.
A step takes what the simulator's throughput model (``scheduler.throughput``,
MODELS.md's figures) says for the model at ``--gpus`` GPUs.  Every arm runs
through the real simulator (``scheduler.simulator.simulate``, the same pass
as the live tick) with the sweep as its feed (``scheduler.sim_sweep.AshaFeed``):
a trial's rung is one job, ended at the rung's budget; a promotion resumes it
as a new job that pays the first-start cost (checkpoint restore) again.

Arms, same GPUs, same sweep, same costs:

* ``fixed``: plain ASHA, every trial on ``--gpus`` GPUs (Tiresias, not elastic);
* ``elastic``: trials elastic under Elastic-Tiresias (grow on idle GPUs while
  their curve gains, give extras back), every weight 1.0;
* ``weighted``: as ``elastic``, promoted trials weigh ``eta ** rung``
  (proportional rule: weight x marginal gain);
* ``weighted-order``: as ``weighted`` with the strict rule (heavier first).

Time to best trial: when the trial the sweep ends up calling best (ASHA's:
best loss at the top rung) finishes its top rung.

    .venv/bin/python bench/sweep_study.py                  # 5 seeds, the table, one JSON line
    .venv/bin/python bench/sweep_study.py --seeds 10 --gpus 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler import asha  # noqa: E402
from scheduler.policies import get_policy  # noqa: E402
from scheduler.policies.base import Policy  # noqa: E402
from scheduler.policies.elastic import curve_limit  # noqa: E402
from scheduler.sim_sweep import AshaFeed, TrialShape, job_id  # noqa: E402
from scheduler.simulator import ScalingCost, SimConfig, simulate  # noqa: E402
from scheduler.throughput import (  # noqa: E402
    get_model,
    speed_table,
    speedup_over_one,
    throughput,
)

TAU_STEPS = 500.0


@dataclass(frozen=True, slots=True)
class Arm:
    """One way to run the sweep: the policy, elastic trials or not, weights or not."""

    name: str
    policy: str
    elastic: bool
    weighted: bool
    weight_rule: str = "proportional"
    narrow: int = 1  # trials ask for --gpus / narrow, and narrow x as many run at once

    def make_policy(self) -> Policy:
        """A fresh policy for one run."""
        if self.policy == "elastic-tiresias":
            return get_policy(self.policy, weight_rule=self.weight_rule)
        return get_policy(self.policy)


ARMS = (
    Arm("fixed", "tiresias", elastic=False, weighted=False),
    Arm("elastic", "elastic-tiresias", elastic=True, weighted=False),
    Arm("weighted", "elastic-tiresias", elastic=True, weighted=True),
    Arm("weighted-order", "elastic-tiresias", elastic=True, weighted=True, weight_rule="order"),
    Arm("elastic-half", "elastic-tiresias", elastic=True, weighted=False, narrow=2),
    Arm("weighted-half", "elastic-tiresias", elastic=True, weighted=True, narrow=2),
)


class LossCurves:
    """Each trial's loss against steps: a power law to a floor drawn per trial (seeded)."""

    def __init__(self, trials: int, seed: int) -> None:
        rng = random.Random(f"sweep-study:{seed}")
        self.params = [
            (rng.uniform(0.2, 0.8), rng.uniform(0.5, 1.5), rng.uniform(0.3, 0.9))
            for _ in range(trials)
        ]

    def loss(self, trial: int, steps: int) -> float:
        """Trial ``trial``'s loss after ``steps`` steps."""
        floor, amp, alpha = self.params[trial]
        return floor + amp * (1.0 + steps / TAU_STEPS) ** -alpha

    def truly_best(self, steps: int) -> int:
        """The trial with the lowest loss at ``steps`` (what a sweep without stops would find)."""
        return min(range(len(self.params)), key=lambda t: self.loss(t, steps))


def _peak_speed(model: str, gpus: int, cluster: int, per_server: int) -> float:
    """Speed (relative to ``gpus``) where an elastic trial's scale-out stops: its curve's limit."""
    top = curve_limit(lambda n: speedup_over_one(model, n, per_server), gpus, cluster)
    return speed_table(model, gpus, top, per_server)[top]


def run_arm(arm: Arm, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One simulated sweep: time to its best trial, which trial, its loss, the makespan."""
    plan = asha.Plan(
        strategy=asha.ASHA,
        mode=asha.MINIMIZE,
        eta=args.eta,
        min_steps=args.max_steps // args.eta ** (args.rungs - 1),
        max_steps=args.max_steps,
        max_trials=args.trials,
        max_running=args.cluster // (args.gpus // arm.narrow),
    )
    model, gpus = get_model(args.model), args.gpus // arm.narrow
    shape = TrialShape(args.model, gpus, model.batch / throughput(model, gpus))
    curves = LossCurves(args.trials, seed)
    feed = AshaFeed(plan, shape, curves.loss, weighted=arm.weighted)
    cost = ScalingCost(
        mode="stop_free",
        broadcast_s=args.broadcast_s,
        restart_s=args.restart_s,
        first_start_s=args.resume_s,
        join_s=args.join_s,
    )
    cfg = SimConfig(
        total_gpus=args.cluster,
        gpus_per_server=args.gpus_per_server,
        cost=cost,
        elastic=arm.elastic,
        max_scale=0.0,  # bounded by the curve only
    )
    result = simulate(feed.first(), arm.make_policy(), cfg, feed=feed)
    best = feed.best()
    assert best is not None and best.index in feed.reached, "the sweep never finished a trial"
    ends = [job.end for job in result.jobs]
    top = next(j for j in result.jobs if j.id == job_id(best.index, best.rung))
    peak = _peak_speed(args.model, gpus, args.cluster, args.gpus_per_server)
    return {
        "time_to_best_s": feed.reached[best.index],
        "best_trial": best.index,
        "best_loss": best.results[best.rung],
        "makespan_s": max(ends),
        "jobs": len(result.jobs),
        "truly_best": curves.truly_best(args.max_steps),
        # the best trial's last rung: its mean speed over its curve's peak (1.0: always there)
        "top_rung_of_peak": top.duration / top.run_time / (peak if arm.elastic else 1.0),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--cluster", type=int, default=64, help="GPUs in the cluster")
    p.add_argument("--gpus-per-server", type=int, default=8)
    p.add_argument("--gpus", type=int, default=4, help="GPUs each trial asks for")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--rungs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=108_000)
    p.add_argument("--resume-s", type=float, default=30.0, help="first start of a rung's job")
    p.add_argument("--restart-s", type=float, default=40.0, help="restart after a preemption")
    p.add_argument("--join-s", type=float, default=10.0, help="newcomers of a scale-out join")
    p.add_argument("--broadcast-s", type=float, default=1.0)
    return p


def _table(runs: dict[str, list[dict[str, Any]]], seeds: int) -> None:
    """Per seed and arm: hours to the best trial, which trial, the ratio to ``fixed``."""
    base = runs["fixed"]
    print(f"{'seed':>4}  " + "  ".join(f"{arm.name:>22}" for arm in ARMS))
    for seed in range(seeds):
        cells = []
        for arm in ARMS:
            run = runs[arm.name][seed]
            ratio = run["time_to_best_s"] / base[seed]["time_to_best_s"]
            hours = run["time_to_best_s"] / 3600
            cells.append(f"{hours:6.2f} h t{run['best_trial']:02d} x{ratio:.2f}")
        print(f"{seed:>4}  " + "  ".join(f"{c:>22}" for c in cells))


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm: its times, losses, and its ratios to ``fixed`` over the seeds."""
    base = runs["fixed"]
    out = {}
    for arm in ARMS:
        pairs = list(zip(runs[arm.name], base, strict=True))
        ratios = [r["time_to_best_s"] / b["time_to_best_s"] for r, b in pairs]
        spans = [r["makespan_s"] / b["makespan_s"] for r, b in pairs]
        out[arm.name] = {
            "time_to_best_h": [round(r["time_to_best_s"] / 3600, 3) for r, _ in pairs],
            "best_loss": [round(r["best_loss"], 4) for r, _ in pairs],
            "ratio_to_fixed_mean": round(statistics.fmean(ratios), 3),
            "ratio_to_fixed_geomean": round(statistics.geometric_mean(ratios), 3),
            "makespan_ratio_mean": round(statistics.fmean(spans), 3),
            "same_best_as_fixed": sum(r["best_trial"] == b["best_trial"] for r, b in pairs),
            "top_rung_of_peak_mean": round(
                statistics.fmean(r["top_rung_of_peak"] for r, _ in pairs), 3
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Every arm on every seed: the table, the ratios to ``fixed``, one JSON line."""
    args = _parser().parse_args(argv)
    runs = {arm.name: [run_arm(arm, seed, args) for seed in range(args.seeds)] for arm in ARMS}
    _table(runs, args.seeds)
    arms = _summary(runs)
    for name, arm in arms.items():
        print(
            f"{name:>15}: time to best / fixed = {arm['ratio_to_fixed_mean']:.3f} mean, "
            f"{arm['ratio_to_fixed_geomean']:.3f} geomean; makespan / fixed = "
            f"{arm['makespan_ratio_mean']:.3f}; same best trial as fixed "
            f"{arm['same_best_as_fixed']}/{args.seeds}; its last rung at "
            f"{arm['top_rung_of_peak_mean']:.2f} of its curve's peak"
        )
    print(json.dumps({"args": vars(args), "arms": arms}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
