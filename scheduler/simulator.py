"""Discrete-event simulator: replays a trace through a policy core on a GPU cluster.

One event loop for every policy and every placement::

    next event = min(completion heap, next arrival, policy wake-up, --tick)
      1. completions      job done: placement.release, accounting.finished, core.remove
                          (or its program failed: requeued with its progress while
                          restarts remain, else failed; or its run-time limit: failed)
         deadlines        a queued job past its run-time limit leaves the queue, failed
      2. arrivals         in trace order: core.add (a job no placement could ever
                          hold, e.g. no vClos shape of its size, is skipped)
      3. one pass         scheduler.pipeline's SchedulingPass with the simulator's steps:
                          core.decide(now) -> [(job, n GPUs)], 0 = preempt
                          each change: placement.place(job, n) -> GPU ids | None
                            placed:   accounting.started / resized / preempted,
                                      new completion time on the heap
                            refused:  the job keeps what it had; core.unplaced()
                                      (FIFO: the starts behind it wait too)
      4. contention       if anything moved: slowdown of every running job's
                          communication -> its pace -> new completion times
    accounting integrates busy GPUs and cluster efficiency between events; with fair
    share on, each tenant's decayed usage advances there too (GPUs held since the last event)

At one timestamp the order is the public Tiresias simulator's: completions
release GPUs, arrivals join, then one scheduling pass.  Completions sit in a
heap with lazy invalidation, so an event costs what changed.

Placements (``SimConfig.placement``, see :func:`scheduler.fabric_placement.sim_placement`):
``count`` (no GPU ids: the policy's count is the placement, the fastest and
the Tiresias simulator's scheme), ``consolidated``, ``vclos`` (bound through
:func:`scheduler.binding.bind`, as in production) and ``ecmp`` (lowest free
ids, with ECMP link contention).  Scaling and preemption costs are parameters
(all free by default, as in the Tiresias simulator).

Where it lives: this module is the entry point, :func:`simulate`, and keeps
every name callers import from it.  The loop is :class:`scheduler.simulation.Simulation`
(one method per event kind); the knobs (:class:`SimConfig`, :class:`ScalingCost`,
:class:`Outage`, and :class:`Fidelity` with its bundles :data:`IDEAL` and
:data:`LIVE_TICK`) are in :mod:`scheduler.sim_config`; the books and the figures
(:class:`Accounting`, :class:`JobResult`, :class:`SimResult`, :func:`summarize`,
:func:`jct_by`) in :mod:`scheduler.sim_accounting`.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.fabric_placement import Contention
from scheduler.placement import SimPlacement
from scheduler.policies.base import Policy
from scheduler.sim_accounting import Accounting, JobResult, SimResult, jct_by, summarize
from scheduler.sim_config import IDEAL, LIVE_TICK, Fidelity, Outage, ScalingCost, SimConfig
from scheduler.sim_feed import FedJob, Feed
from scheduler.simulation import Simulation
from scheduler.traces import TraceJob

__all__ = [
    "IDEAL",
    "LIVE_TICK",
    "Accounting",
    "FedJob",
    "Feed",
    "Fidelity",
    "JobResult",
    "Outage",
    "ScalingCost",
    "SimConfig",
    "SimResult",
    "Simulation",
    "jct_by",
    "simulate",
    "summarize",
]


def simulate(
    trace: Sequence[TraceJob],
    policy: Policy,
    cfg: SimConfig,
    *,
    placement: SimPlacement | None = None,
    contention: Contention | None = None,
    feed: Feed | None = None,
) -> SimResult:
    """Replay ``trace`` (sorted by submit time) through ``policy``; returns results and figures.

    The placement and its contention model come from ``cfg.placement`` unless
    ``placement`` is given (then ``contention`` goes with it; None: links are
    free).  With any placement but ``count`` the policy is reported as
    ``policy+placement`` and the summary adds ``skipped`` (jobs no placement
    could ever hold) and ``mean_max_slowdown``; with an elastic policy also
    ``grow_requests`` and ``grow_refused`` (resizes up the placement was asked
    for and refused: no shape free) and ``start_extras_refused`` (starts whose
    extra GPUs fitted no shape; they started on their base size); with a
    contention model ``job_slowdown``: the distribution over jobs of each job's
    communication slowdown averaged over the time it ran.

    ``feed`` (:mod:`scheduler.sim_feed`) adds jobs as the run goes: at each
    job's end it may feed more (a sweep's promotions), each with its weight.
    """
    return Simulation(trace, policy, cfg, placement, contention, feed).run()
