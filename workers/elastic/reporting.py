"""What the leader tells the world each mini-batch: progress, stragglers, finished switches.

Events go to the job's stream (``publish``), step metadata to its hash
(``LeaderMeta.save_step``).  Progress is rate-limited on the injected clock.
"""

from __future__ import annotations

import math

import redis

from workers.clock import Clock
from workers.elastic.constants import log
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.elastic.leader_meta import LeaderMeta
from workers.elastic.messages import SwitchPlan
from workers.elastic.straggler import DEFAULT_RULE, StragglerDetector, StragglerRule
from workers.elastic.views import ReportedJob
from workers.runtime_events import ProgressEvent, ScaleDoneEvent, StragglerEvent, finite_or_none

PROGRESS_EVERY_S = 0.5


class JobReporter:
    """The leader's reports about its job."""

    def __init__(
        self,
        client: redis.Redis,
        keys: JobKeys,
        meta: LeaderMeta,
        clock: Clock,
        rule: StragglerRule = DEFAULT_RULE,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.meta = meta
        self.clock = clock
        self.detector = StragglerDetector(rule)
        self.reported: set[str] = set()
        self._last_progress = -math.inf

    def step_done(self, view: ReportedJob) -> None:
        """After each committed mini-batch: metadata, and progress every ``PROGRESS_EVERY_S``."""
        t_b = view.batch_time()
        sps = view.opts.batch_size / t_b if t_b > 0 else 0.0
        self.meta.save_step(view, sps)
        now = self.clock.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            event = ProgressEvent(
                step=view.step,
                samples_per_s=sps,
                loss=finite_or_none(view.last_loss),
                world=view.world,
                generation=view.generation,
            )
            publish(self.redis, self.keys, event)

    def new_stragglers(self, view: ReportedJob, times: dict[str, float]) -> list[str]:
        """Feed one mini-batch's compute times; report and return workers newly flagged
        (once per worker and generation)."""
        flagged = []
        for worker, ratio in self.detector.observe(times):
            if worker in self.reported:
                continue  # once per worker and generation
            self.reported.add(worker)
            publish(
                self.redis, self.keys, StragglerEvent(worker=worker, ratio=ratio, step=view.step)
            )
            log(view.me, f"straggler {worker} ({ratio:.2f}x median)")
            flagged.append(worker)
        return flagged

    def scale_done(
        self, plan: SwitchPlan, pause_s: float, step: int, new_leader: str | None = None
    ) -> None:
        """Tell the world (the agent, the control plane) that ``plan``'s switch happened.

        Straggler evidence starts afresh in the new generation, and a straggler
        reported before may be reported again: whoever acts on the report (the
        control plane) may have kept it while the job was changing.
        """
        self.detector.reset()
        self.reported.clear()
        event = ScaleDoneEvent(
            generation=plan.generation,
            world=len(plan.members),
            members=plan.members,
            joiners=plan.joiners,
            leavers=plan.leavers,
            pause_s=pause_s,
            step=step,
            new_leader=new_leader,
        )
        publish(self.redis, self.keys, event)
