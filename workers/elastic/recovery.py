"""A worker's side of failure recovery (the leader's side is in ``leader_recovery.py``).

::

    collective fails ─▶ close the group ─▶ survivors:{g} += (me, step) ─▶ wait recovery:{g}
        ─▶ not a member: leave ("dropped")
        ─▶ build the new group ─▶ consistent: load the plan's checkpoint
                                   approximate: the most advanced survivor broadcasts its state
        ─▶ recovered:{g'} += me
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from workers.elastic import comm
from workers.elastic.constants import ElasticError, log
from workers.elastic.membership import MemberParts
from workers.elastic.messages import RecoveryPlan
from workers.elastic.transfer import TrainingState


@dataclass(eq=False)
class WorkerRecovery(MemberParts):
    """Brings one worker through the failure of its generation."""

    sync_timeout_s: float

    def recover(self, training: TrainingState, exc: BaseException) -> bool:
        """Recover from ``exc``; False if the recovery plan drops this worker."""
        me = self.view.me
        failed_gen = self.view.generation
        log(me, f"generation {failed_gen} failed at step {training.step}: {str(exc)[:160]}")
        group, self.view.group = self.view.group, None
        with contextlib.suppress(Exception):  # best effort; the sync timeout is the fallback
            group.abort()
        # The traceback's frames hold the group too: drop them, and let a daemon thread
        # hold the last reference until the abandoned collective has timed out.
        exc.with_traceback(None)
        comm.release_later(group, self.sync_timeout_s + 5.0)
        del group
        training.actions.clear()
        self.redis.hset(self.keys.survivors(failed_gen), me, training.step)
        plan = self._wait_for_plan(failed_gen)
        if me not in plan.members:
            return False
        gen = plan.generation
        self.builder.build(plan)
        group = self.builder.take(gen, f"recovery generation {gen} failed")
        self.view.move_to(group, gen, plan.members)
        if plan.mode == "consistent":
            if plan.step is None:
                raise ElasticError("consistent recovery without a checkpoint")
            training.load(self.transfer.checkpoint_at(plan.step), True)
        else:
            mine = training.snapshot() if self.view.rank == plan.source else None
            state = self.transfer.broadcast(group, mine, plan.source)
            training.load(state, self.view.rank != plan.source)
        training.plan_seen = plan.plan_seq
        training.actions.clear()
        self.redis.sadd(self.keys.k("recovered", gen), me)
        log(me, f"recovered ({plan.mode}) into generation {gen} at step {training.step}")
        return True

    def _wait_for_plan(self, failed_gen: int) -> RecoveryPlan:
        deadline = self.clock.monotonic() + self.sync_timeout_s * 4 + 30
        while (raw := self.redis.get(self.keys.recovery(failed_gen))) is None:
            if self.clock.monotonic() > deadline:
                raise ElasticError(f"no recovery plan for generation {failed_gen}")
            self.clock.sleep(0.05)
        return RecoveryPlan.from_json(raw)
