"""An ASHA sweep as a simulation feed: :mod:`scheduler.asha`'s rule, each rung one job.

The live sweep runs a trial's rungs as jobs, each resumed from the
checkpoint the last one left; here too::

    trial 7:  job t007r0 (rung 0's steps) ──ended──> asha.next_moves ──promote──> job t007r1
                                                         │                  (next rung's steps,
                                                         └──launch──> t012r0  weight eta**1)

A rung job's work is the steps from the previous rung's budget to its own, at
``step_s`` seconds a step on the requested GPUs; its metric at the rung comes
from ``metric(trial, steps)`` (the study's synthetic loss curves).  Weighted
(``weighted=True``) a job weighs ``asha.weight(rung, eta)``, as the live sweep
sets ``Job.sched_weight``; unweighted every job weighs 1.0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler import asha
from scheduler.sim_feed import FedJob
from scheduler.traces import TraceJob


@dataclass(frozen=True, slots=True)
class TrialShape:
    """How every trial of the sweep runs: its workload, GPUs asked, and seconds a step there."""

    model: str
    gpus: int
    step_s: float
    tenant: str = "sweep"


def job_id(trial: int, rung: int) -> str:
    """The job that runs ``trial`` through ``rung``."""
    return f"t{trial:03d}r{rung}"


def trial_of(job: str) -> tuple[int, int]:
    """(trial, rung) of a job named by :func:`job_id`."""
    trial, rung = job[1:].split("r")
    return int(trial), int(rung)


class AshaFeed:
    """:func:`scheduler.asha.next_moves` fed by a simulated run's job ends (a :class:`~scheduler.sim_feed.Feed`).

    ``reached`` holds, per trial that finished its top rung, when it did; the
    sweep's answer is :meth:`best` (ASHA's: the best result at the highest rung).
    """

    def __init__(
        self,
        plan: asha.Plan,
        shape: TrialShape,
        metric: Callable[[int, int], float],
        *,
        weighted: bool,
    ) -> None:
        self.plan = plan
        self.shape = shape
        self.metric = metric
        self.weighted = weighted
        self.trials: list[asha.TrialView] = []
        self.reached: dict[int, float] = {}

    def first(self) -> list[TraceJob]:
        """The trials the sweep launches at time 0 (rung 0: weight 1.0)."""
        return [fed.job for fed in self._act(asha.next_moves(self.plan, self.trials), 0.0)]

    def ended(self, job: str, now: float) -> list[FedJob]:
        """A rung job finished: its trial's result there, then the rule's next moves."""
        index, rung = trial_of(job)
        top = len(self.plan.rungs) - 1
        status = asha.TrialStatus.COMPLETED if rung == top else asha.TrialStatus.WAITING
        trial = self.trials[index]
        results = {**trial.results, rung: self.metric(index, self.plan.rungs[rung])}
        self.trials[index] = asha.TrialView(index, rung, status, results)
        if rung == top:
            self.reached[index] = now
        return self._act(asha.next_moves(self.plan, self.trials), now)

    def best(self) -> asha.TrialView | None:
        """The sweep's best trial so far."""
        return asha.best(self.plan, self.trials)

    def _act(self, decisions: asha.Decisions, now: float) -> list[FedJob]:
        """Book the rule's decisions on the trials; the jobs they start."""
        fed = []
        for stop in decisions.stop:
            old = self.trials[stop.index]
            self.trials[stop.index] = asha.TrialView(
                old.index, old.rung, asha.TrialStatus.STOPPED, old.results
            )
        for move in decisions.promote:
            old = self.trials[move.index]
            self.trials[move.index] = asha.TrialView(
                old.index, move.rung, asha.TrialStatus.RUNNING, old.results
            )
            fed.append(self._job(move.index, move.rung, now))
        for index in decisions.launch:
            assert index == len(self.trials)
            self.trials.append(asha.TrialView(index, 0, asha.TrialStatus.RUNNING))
            fed.append(self._job(index, 0, now))
        return fed

    def _job(self, trial: int, rung: int, now: float) -> FedJob:
        """The job that runs ``trial`` from its last rung's budget to ``rung``'s."""
        rungs, shape = self.plan.rungs, self.shape
        steps = rungs[rung] - (rungs[rung - 1] if rung else 0)
        job = TraceJob(
            job_id(trial, rung),
            now,
            shape.gpus,
            steps * shape.step_s,
            model=shape.model,
            tenant=shape.tenant,
        )
        weight = asha.weight(rung, self.plan.eta) if self.weighted else 1.0
        return FedJob(job, weight)
