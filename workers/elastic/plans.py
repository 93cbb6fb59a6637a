"""Following the leader's plans: learn them at a mini-batch, carry them out k mini-batches later.

::

    all-reduce at t ── plan seq n ──▶ read plan:{seen+1..n}
        prepare (I am a member) ──▶ build its group in the background ──▶ ready:{g} += me
        switch / stop           ──▶ actions[t + k]
    end of mini-batch t + k ──▶ switch: leavers leave; the rest swap groups (+ state to joiners)
                              stop:   leave the loop
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.elastic.constants import log
from workers.elastic.leader import Leader
from workers.elastic.membership import MemberParts
from workers.elastic.messages import Plan, PreparePlan, StopPlan, SwitchPlan, plan_from_json
from workers.elastic.transfer import TrainingState


@dataclass(eq=False)
class PlanFollower(MemberParts):
    """One member's side of the leader's plans."""

    leading: Callable[[], Leader | None]  # the leader while this worker leads, else None
    last_pause_s: float = field(default=0.0, init=False)

    def learn(self, training: TrainingState, seq: int) -> None:
        """Read the plans up to ``seq``: every member learns them at this same mini-batch."""
        while training.plan_seen < seq:
            training.plan_seen += 1
            raw = self.redis.get(self.keys.plan(training.plan_seen))
            if raw is not None:
                self._accept(training, plan_from_json(raw))

    def _accept(self, training: TrainingState, plan: Plan) -> None:
        if plan.base_generation != self.view.generation:
            return  # issued for an older membership
        if isinstance(plan, SwitchPlan | StopPlan):
            training.actions.setdefault(training.step + plan.k, []).append(plan)
        elif self.view.me in plan.members:  # a PreparePlan
            self._build_ahead(plan)

    def _build_ahead(self, plan: PreparePlan) -> None:
        """Build the prepared generation's group in the background, then say ready (once)."""
        gen, me = plan.generation, self.view.me

        def ready() -> None:
            self.redis.sadd(self.keys.ready(gen), me)

        self.builder.build_in_background(plan, ready)

    def watch_nudges(self, running: Callable[[], bool]) -> None:
        """Until ``running()`` is False: build a prepared group as soon as the leader nudges.

        A prepare plan needs no agreement on a mini-batch (only the switch does),
        so a member may start building its group at once instead of at its next
        all-reduce; learning the plan there later finds the build under way.
        """
        while running():
            try:
                item = self.redis.blpop([self.keys.nudge(self.view.me)], timeout=1)
                if item is None:
                    continue
                raw = self.redis.get(self.keys.plan(int(item[1])))
                plan = plan_from_json(raw) if raw is not None else None
            except Exception as exc:  # an aid only: the all-reduce path still learns the plan
                log(self.view.me, f"nudge: {type(exc).__name__}: {exc}")
                self.clock.sleep(1.0)
                continue
            if (
                type(plan) is PreparePlan
                and plan.base_generation == self.view.generation
                and self.view.me in plan.members
            ):
                self._build_ahead(plan)

    def carry_out(self, training: TrainingState) -> str | None:
        """Do what is due at the committed step; return an exit reason if this worker leaves."""
        reason = None
        for plan in training.actions.pop(training.step, []):
            if isinstance(plan, SwitchPlan):
                if not self._switch(training, plan):
                    reason = "left"
            elif isinstance(plan, StopPlan):
                reason = "stopped"
        return reason

    def _switch(self, training: TrainingState, plan: SwitchPlan) -> bool:
        """Move to the plan's generation; False if this worker leaves instead."""
        me, gen = self.view.me, plan.generation
        leader = self.leading()
        if me not in plan.members:
            if leader is not None:
                if plan.handoff:
                    self.transfer.leave(training, gen)
                leader.hand_off(plan.members[0], plan)
            log(me, f"leaving at step {training.step} (generation {gen})")
            return False
        t0 = self.clock.monotonic()
        group = self.builder.take(gen, f"generation {gen} was not built")
        self.view.move_to(group, gen, plan.members)
        timings = {"take": self.clock.monotonic() - t0}
        if plan.joiners and self.view.rank == plan.source:
            # Only the joiners lack the state: the others go on to the next mini-batch,
            # whose all-reduce waits for the joiners to have it.
            self.transfer.send_to_joiners(group, training, plan, timings)
        self.last_pause_s = self.clock.monotonic() - t0
        self.redis.hset(self.keys.pauses(gen), me, self.last_pause_s)
        self.redis.hset(self.keys.switch_profile(gen), me, json.dumps(timings))
        if leader is not None:
            leader.on_switched(plan, self.last_pause_s)
        log(
            me,
            f"switched to generation {gen}: rank {self.view.rank}/{self.view.world} at step {training.step}",
        )
        return True
