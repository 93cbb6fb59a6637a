"""The training state and how it moves: checkpoints in the store, broadcasts, hand-off in Redis.

``TrainingState`` is what a worker must share to be interchangeable with
another: model, optimizer, committed step, the plans it has seen and the
switches it has scheduled.  ``snapshot()`` is its wire form (tensors and
plain data only, so the Redis hand-off loads with ``weights_only``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import torch

from workers.clock import Clock
from workers.elastic import comm
from workers.elastic.checkpoint import Checkpoints, Skipped
from workers.elastic.cli import WorkerOptions
from workers.elastic.constants import JOIN_WAIT_S, ElasticError, log
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.elastic.lease import peer_is_dead
from workers.elastic.messages import Plan, PreparePlan, plan_from_dict
from workers.elastic.redis_client import connect
from workers.runtime_events import CheckpointSavedEvent, CheckpointSkippedEvent
from workers.store_door import open_store

FINAL_WAIT_S = 600.0
"""How long the leader waits for rank 0's last checkpoint before it reports the job ended."""


@dataclass
class TrainingState:
    """What a worker trains with and what it has agreed to do next."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: int = 0
    plan_seen: int = 0
    actions: dict[int, list[Plan]] = field(default_factory=dict)
    """Plans to carry out at the end of a given committed step (switch, stop)."""

    def snapshot(self) -> dict[str, Any]:
        """The state as a dict of tensors and plain data."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "plan_seen": self.plan_seen,
            "actions": {at: [p.to_dict() for p in plans] for at, plans in self.actions.items()},
        }

    def load(self, state: dict[str, Any], load_tensors: bool) -> None:
        """Adopt a snapshot (tensors only if ``load_tensors``: the source keeps its own)."""
        if load_tensors:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.plan_seen = int(state.get("plan_seen", self.plan_seen))
        self.actions = {
            int(at): [plan_from_dict(p) for p in plans]
            for at, plans in state.get("actions", {}).items()
        }


class StateTransfer:
    """Moves a worker's ``TrainingState``: to the store, to peers, through Redis."""

    def __init__(self, options: WorkerOptions, device: torch.device, clock: Clock) -> None:
        self.opts = options
        self.me = options.worker_id
        self.keys = JobKeys(options.job_id)
        self.device = device
        self.clock = clock
        self._raw = connect(  # bytes, not text
            options.redis_url, outage_s=options.redis_outage_s, decode_responses=False
        )
        self.store = open_store(options.store_url)
        self.checkpoints = Checkpoints(self.store, options.checkpoint_keep, clock)
        self._last_checkpoint = clock.monotonic()
        self._saved_step: int | None = None

    # -- checkpoints (rank 0 writes, anyone reads: the store is the job's, not the node's) --
    def maybe_checkpoint(
        self, state: TrainingState, rank: int, force: bool = False, final: bool = False
    ) -> None:
        """Write a checkpoint if one is due (every N steps and/or M minutes), forced or final."""
        if rank != 0:
            return
        every = self.opts.checkpoint_every
        minutes = self.opts.checkpoint_minutes
        since = self.clock.monotonic() - self._last_checkpoint
        periodic = every > 0 and state.step % every == 0
        # Every N steps, but not more often than the floor: fast steps would otherwise write
        # (and report) several checkpoints a second.
        due = force or final or (periodic and since >= self.opts.checkpoint_min_seconds)
        if minutes is not None and since >= minutes * 60:
            due = True
        if not due or (state.step == self._saved_step and not final):
            return
        saved = self.checkpoints.save(state.step, state.snapshot(), final=final)
        self._saved_step = state.step
        self._last_checkpoint = self.clock.monotonic()
        event = CheckpointSavedEvent(
            step=saved.step,
            path=saved.stored.path,
            size=saved.stored.size,
            sha256=saved.stored.sha256,
            final=saved.final,
            pruned=saved.pruned,
        )
        publish(self._raw, self.keys, event)

    def save_at_end(self, state: TrainingState, rank: int, final: bool) -> None:
        """Rank 0's checkpoint when the job ends, then the mark the leader waits for."""
        if rank != 0:
            return
        self.maybe_checkpoint(state, rank, force=True, final=final)
        self._raw.set(self.keys.saved_at_end, state.step, ex=int(FINAL_WAIT_S))

    def wait_for_end_checkpoint(self, rank0: str) -> None:
        """The leader (not rank 0): wait until rank 0 saved its last checkpoint, or is gone."""
        deadline = self.clock.monotonic() + FINAL_WAIT_S
        while not self._raw.exists(self.keys.saved_at_end):
            if self.clock.monotonic() > deadline or peer_is_dead(self._raw, self.keys, rank0):
                log(self.me, "rank 0's last checkpoint did not come; reporting the end anyway")
                return
            self.clock.sleep(0.05)

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint of the job that verifies (reporting the ones skipped), if any."""
        restored, skipped = self.checkpoints.load_latest()
        report_skipped(self._raw, self.keys, skipped)
        if restored is None:
            return None
        self._saved_step = restored.step
        log(self.me, f"restoring the checkpoint of step {restored.step}")
        return restored.state

    def checkpoint_at(self, step: int) -> dict[str, Any]:
        """The checkpoint of ``step``, verified (the job goes back to it: it may be saved again)."""
        state = self.checkpoints.load_step(step)
        self._saved_step = step
        return state

    # -- joining ----------------------------------------------------------------------
    def start_first_generation(self, training: TrainingState, group: Any, rank: int) -> None:
        """Generation 0: everyone takes rank 0's state (the latest checkpoint on a restart)."""
        restored = self.latest_checkpoint() if rank == 0 else None
        if restored is not None:  # a restarted job: earlier plans are void
            restored.update(plan_seen=0, actions={})
        mine = (training.snapshot() if restored is None else restored) if rank == 0 else None
        state = self.broadcast(group, mine, 0)
        training.load(state, restored is not None or rank != 0)
        if restored is None:  # consistent recovery needs a step to go back to
            self.maybe_checkpoint(training, rank, force=True)

    def join_running(
        self,
        training: TrainingState,
        group: Any,
        plan: PreparePlan,
        timings: dict[str, float] | None = None,
    ) -> None:
        """A ready newcomer: wait (several mini-batches, maybe) for the state at its switch."""
        if plan.handoff:
            state = self.take(plan.generation)
        else:
            state = comm.receive_state(
                group, plan.source, self.device, timeout_s=JOIN_WAIT_S, timings=timings
            )
        training.load(state, True)

    def send_to_joiners(
        self,
        group: Any,
        training: TrainingState,
        plan: PreparePlan,
        timings: dict[str, float] | None = None,
    ) -> None:
        """The switch's source: send the state to the plan's joiners (the others hold it)."""
        joiners = [plan.members.index(w) for w in plan.joiners]
        comm.send_state(group, training.snapshot(), joiners, timings=timings)

    # -- broadcasts over the process group ---------------------------------------------
    def broadcast(
        self,
        group: Any,
        snapshot: dict[str, Any] | None,
        source: int,
        *,
        want: bool = True,
        timeout_s: float | None = None,
        timings: dict[str, float] | None = None,
    ) -> Any:
        """Broadcast a snapshot from rank ``source`` (None on the receivers); return it."""
        return comm.broadcast_state(
            group, snapshot, source, self.device, want=want, timeout_s=timeout_s, timings=timings
        )

    # -- hand-off through Redis (when every worker of a job moves) ----------------------
    def leave(self, state: TrainingState, generation: int) -> None:
        """Leave the training state in Redis for newcomers that replace every worker."""
        buffer = io.BytesIO()
        torch.save(state.snapshot(), buffer)
        self._raw.set(self.keys.handoff(generation), buffer.getvalue(), ex=int(JOIN_WAIT_S))
        log(self.me, f"left the state for generation {generation} ({buffer.tell()} bytes)")

    def take(self, generation: int) -> dict[str, Any]:
        """Wait for the state the last leader left at the switch, and read it."""
        deadline = self.clock.monotonic() + JOIN_WAIT_S
        while (blob := cast(bytes | None, self._raw.get(self.keys.handoff(generation)))) is None:
            if self.clock.monotonic() > deadline:
                raise ElasticError(f"no state was left for generation {generation}")
            self.clock.sleep(0.05)
        # weights_only: Redis is writable by peers, so nothing in it may run code.
        state: dict[str, Any] = torch.load(
            io.BytesIO(blob), map_location=self.device, weights_only=True
        )
        return state


def report_skipped(client: redis.Redis, keys: JobKeys, skipped: list[Skipped]) -> None:
    """Publish one ``checkpoint_skipped`` event per checkpoint that failed its check."""
    for item in skipped:
        publish(client, keys, CheckpointSkippedEvent(step=item.step, reason=item.reason))
