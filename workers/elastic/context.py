"""The elastic training API: what a user's ordinary PyTorch loop wraps.

::

    ctx = ElasticContext(options)              # background thread registers now
    model, optimizer, data = prepare()         # main thread prepares meanwhile
    ctx.attach(model, optimizer, ElasticSampler(len(data), options.batch_size), total_steps)
    for batch in ctx.steps():                  # one item per global mini-batch
        optimizer.zero_grad()
        loss = loss_fn(model(x[batch.indices]), y[batch.indices], reduction="sum")
        loss.backward()
        if not ctx.sync_gradients(loss.item(), len(batch.indices)):
            continue                           # a peer failed: recovered, redo the step
        optimizer.step()
        ctx.notify_batch_end()                 # report, switch communicator, or leave

``sync_gradients`` sums the gradients (and a small control vector) over the
current generation's communicator and divides by the global batch, so the
update does not depend on how many workers share it. The control vector
carries the leader's latest plan number, the loss, the sample count and each
worker's compute time: every member learns a plan at the same mini-batch,
which is what makes the future-step switch agree without another message.

The context composes the runtime's parts and owns none of their logic::

    ElasticContext ──┬── Registration, GroupBuilder, Membership   (membership.py)
                     ├── Lease, Beat                              (lease.py)
                     ├── TrainingState, StateTransfer             (transfer.py, checkpoint.py)
                     ├── ProgramOutputs: artifacts, metrics       (outputs.py)
                     ├── WorkerRecovery                           (recovery.py)
                     ├── StepTimes                                (timing.py)
                     └── Leader, while this worker leads          (leader.py)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from workers.artifacts import StoredObject
from workers.clock import SYSTEM_CLOCK, Clock
from workers.elastic import comm, gradients, phases
from workers.elastic.cli import WorkerOptions
from workers.elastic.constants import ElasticError, log
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.elastic.leader import Leader
from workers.elastic.lease import Beat, Lease, first_dead_peer
from workers.elastic.membership import GroupBuilder, Membership, Registration
from workers.elastic.outputs import ProgramOutputs
from workers.elastic.plans import PlanFollower
from workers.elastic.recovery import WorkerRecovery
from workers.elastic.redis_client import connect
from workers.elastic.sampler import ElasticSampler
from workers.elastic.store import RedisStore
from workers.elastic.timing import StepLog, StepTimes
from workers.elastic.transfer import StateTransfer, TrainingState
from workers.runtime_events import FailedEvent

__all__ = ["Batch", "ElasticContext", "ElasticError"]


@dataclass(frozen=True)
class Batch:
    """One global mini-batch as seen by this worker."""

    step: int
    epoch: int
    indices: np.ndarray


class ElasticContext:
    """Rank, world, device and generation of this worker, and the hooks of its loop."""

    def __init__(self, options: WorkerOptions, clock: Clock = SYSTEM_CLOCK) -> None:
        self.opts = options
        self.me = options.worker_id
        self.clock = clock
        self.keys = JobKeys(options.job_id)
        self.redis = connect(options.redis_url, outage_s=options.redis_outage_s)
        self.device = torch.device(options.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.view = Membership(self.me)
        self.state = "starting"
        self.builder = GroupBuilder(
            RedisStore(
                options.redis_url,
                self.keys.store(),
                options.redis_outage_s,
                abandoned=self._why_abandon,
            ),
            self.me,
            self.device,
            options.sync_timeout_s,
            options.backend,
        )
        self.transfer = StateTransfer(options, self.device, clock)
        self.outputs = ProgramOutputs(self.transfer.store, self.redis, self.keys, clock)
        self.training: TrainingState | None = None
        self.total_steps = 0
        self.exit_reason: str | None = None
        # observations for the leader
        self.last_loss = math.nan
        self.times = StepTimes()
        self.last_pause_s = 0.0
        self._t_step = clock.monotonic()
        self.leader: Leader | None = None
        self._lead_lock = threading.Lock()
        self._step_log = StepLog(options.step_log) if options.step_log else None
        self._first_batch_marked = False
        self.sampler: ElasticSampler | None = None
        self._params: list[torch.nn.Parameter] = []
        self.lease = Lease(self.redis, self.keys, self.me, clock)
        self._registration = Registration(
            self.redis,
            self.keys,
            self.me,
            options.initial_world,
            options.sync_timeout_s,
            self.builder,
            clock,
            options.rank,
        )
        self._registration.start()
        parts = (self.redis, self.keys, self.view, self.builder, self.transfer, clock)
        self._recovery = WorkerRecovery(*parts, options.sync_timeout_s)
        self.plans = PlanFollower(*parts, self._leading)
        threading.Thread(
            target=self.plans.watch_nudges,
            args=(lambda: self.exit_reason is None,),
            daemon=True,
            name="edl-nudges",
        ).start()
        self._beat = Beat(self.lease, self._may_lead, self._become_leader, clock)
        self._beat.start()

    # -- what the loop and the leader read ----------------------------------------------
    @property
    def batch_size(self) -> int:
        """The job's global mini-batch: fixed, whatever the number of workers."""
        return self.opts.batch_size

    @property
    def store_url(self) -> str:
        """The job's store: checkpoints under ``checkpoints/``, ``save_artifact`` files under ``artifacts/``."""
        return self.opts.store_url

    @property
    def checkpoint_dir(self) -> str:
        """The job's store (the earlier name of ``store_url``, kept for SDK 1.x programs)."""
        return self.opts.store_url

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation."""
        return self.view.rank

    @property
    def world(self) -> int:
        """Number of workers in the current generation."""
        return self.view.world

    @property
    def generation(self) -> int:
        """The current generation (-1 before the first)."""
        return self.view.generation

    @property
    def members(self) -> list[str]:
        """Worker ids of the current generation, in rank order."""
        return self.view.members

    @property
    def step(self) -> int:
        """Committed mini-batches."""
        return self.training.step if self.training is not None else 0

    @property
    def epoch(self) -> int:
        """The epoch of the next mini-batch."""
        return self.sampler.epoch_of(self.step) if self.sampler is not None else 0

    @property
    def is_leader(self) -> bool:
        """Whether this worker leads the job now."""
        return self.leader is not None and self.leader.active

    def _leading(self) -> Leader | None:
        """The leader, while this worker leads."""
        leader = self.leader
        return leader if leader is not None and leader.active else None

    def batch_time(self) -> float:
        """Median wall time of the recent mini-batches (``T_b``)."""
        return self.times.batch_time()

    def throughput_since(self, step: int) -> tuple[int, float]:
        """(mini-batches, seconds) between the end of ``step`` and the latest step end."""
        return self.times.throughput_since(step)

    # -- leadership ----------------------------------------------------------------------
    def _may_lead(self) -> bool:
        return (
            self.state in ("running", "recovering")
            and self.exit_reason is None
            and self.step < self.total_steps
            and not self.is_leader
        )

    def _become_leader(self) -> None:
        with self._lead_lock:
            if self.is_leader:
                return
            log(self.me, f"leader of generation {self.generation}")
            self.leader = Leader(self, self.redis, self.clock)
            self.leader.start()

    # -- set-up ------------------------------------------------------------------------
    def attach(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        total_steps: int,
    ) -> None:
        """Hand over the prepared model, optimizer and data; join the job's training.

        Generation-0 workers share rank 0's state (or the latest checkpoint
        when the job restarts); a newcomer waits here, ready, until the
        switch step, where an existing worker broadcasts it the state.
        """
        training = TrainingState(model, optimizer)
        self.sampler = sampler
        self.total_steps = (
            total_steps if self.opts.max_steps is None else min(total_steps, self.opts.max_steps)
        )
        self._params = [p for p in model.parameters() if p.requires_grad]
        joined = self._registration.wait()
        plan = joined.plan
        gen = plan.generation
        group = self.builder.take(gen, f"generation {gen} could not be built")
        self.view.move_to(group, gen, plan.members)
        self.training = training
        if joined.first_generation:
            if self.rank == 0:
                self.lease.claim_first()
            self.transfer.start_first_generation(training, group, self.rank)
        else:
            # ready: the model is prepared and the communicator built; wait for the switch
            self.redis.sadd(self.keys.ready(gen), self.me)
            phases.mark("ready")
            timings: dict[str, float] = {}
            self.transfer.join_running(training, group, plan, timings)
            phases.mark("state_loaded")
            self.redis.hset(self.keys.switch_profile(gen), self.me, json.dumps(timings))
        if self.lease.is_mine():
            self._become_leader()
        self.state = "running"
        self._t_step = self.clock.monotonic()
        self.times.mark(self.step, self._t_step)
        log(self.me, f"training: generation {gen}, rank {self.rank}/{self.world}, step {self.step}")

    # -- the loop ----------------------------------------------------------------------
    def steps(self) -> Iterator[Batch]:
        """Yield this worker's share of each global mini-batch until training ends or it leaves."""
        assert self.sampler is not None
        while self.exit_reason is None and self.step < self.total_steps:
            self._t_step = self.clock.monotonic()
            yield Batch(
                self.step,
                self.sampler.epoch_of(self.step),
                self.sampler.local_indices(self.step, self.rank, self.world),
            )
        self._finish()

    def sync_gradients(self, loss_sum: float, local_count: int) -> bool:
        """All-reduce gradients (averaged over the global batch) and the control vector.

        Returns False when a peer failed: the job has then recovered (per the
        job's recovery mode) and the loop must redo the step ``steps()`` yields.
        """
        assert self.training is not None
        if self.opts.slow_ms > 0:
            self.clock.sleep(self.opts.slow_ms / 1000.0)  # injected straggler (tests, benchmarks)
        leader = self._leading()
        flat = gradients.pack(
            self._params,
            plan_seq=leader.published_seq if leader is not None else 0,
            loss_sum=loss_sum,
            count=local_count,
            rank=self.rank,
            world=self.world,
            compute_s=self.clock.monotonic() - self._t_step,
            device=self.device,
        )
        try:
            # NCCL's wait does not block the host (its watchdog times out): gloo only
            watch = self._watch if comm.is_gloo(self.view.group) else None
            comm.allreduce_sum(self.view.group, flat, watch)
        except Exception as exc:
            self._recover(exc)
            return False
        synced = gradients.unpack(flat, self._params, self.members)
        self.last_loss = synced.mean_loss
        if leader is not None:
            leader.observe_times(synced.times)
        self.plans.learn(self.training, synced.plan_seq)
        return True

    def notify_batch_end(self) -> None:
        """Commit the mini-batch: report, checkpoint, and switch or leave at the agreed step."""
        training = self.training
        assert self.sampler is not None and training is not None
        training.step += 1
        self.times.mark(training.step, self.clock.monotonic())
        if not self._first_batch_marked:
            self._first_batch_marked = True
            phases.mark("first_batch")
        if self._step_log is not None:
            done = training.step - 1
            self._step_log.write(
                step=done,
                epoch=self.sampler.epoch_of(done),
                gen=self.generation,
                rank=self.rank,
                world=self.world,
                worker=self.me,
                t=self.clock.now(),
                loss=self.last_loss,
                indices=self.sampler.local_indices(done, self.rank, self.world).tolist(),
                # where the model really is (the benchmark's --device cuda checks it)
                device=str(self._params[0].device) if self._params else str(self.device),
            )
        leader = self._leading()
        if leader is not None:
            leader.on_step()
        if training.step < self.total_steps:  # the last step's checkpoint is the final one
            self.transfer.maybe_checkpoint(training, self.rank)
        generation = self.generation
        reason = self.plans.carry_out(training)
        if reason is not None:
            self.exit_reason = reason
        if self.generation != generation:  # switched: the next step's clock starts now
            self.last_pause_s = self.plans.last_pause_s
            self._t_step = self.clock.monotonic()

    def _watch(self) -> str | None:
        """While blocked in the gradient all-reduce: a member whose liveness key lapsed."""
        return first_dead_peer(self.redis, self.keys, self.members, self.me)

    def _recover(self, exc: BaseException) -> None:
        """A collective failed: report as a survivor, wait for the leader's plan, rebuild."""
        assert self.training is not None
        self.state = "recovering"
        if self._recovery.recover(self.training, exc):
            self.state = "running"
        else:
            self.exit_reason = "dropped"

    # -- what the program hands the job ------------------------------------------------
    def save_artifact(self, path: str | os.PathLike[str], name: str | None = None) -> StoredObject:
        """Upload the local file ``path`` to the job's ``artifacts/<name>`` (default: its base name).

        ``name`` may contain ``/`` (``eval/report.json``) but no ``..``, leading
        ``/`` or hidden parts.  The upload is atomic and its sha256 is recorded;
        the job page lists the file for download.  Every worker runs the same
        loop, so save from one rank (``if ctx.rank == 0``) unless the names differ.
        """
        return self.outputs.save_artifact(path, name, self.step if self.training else None)

    def log_metrics(self, step: int, **values: float) -> None:
        """Record metrics of ``step`` (finite numbers, at most 32 names) for the job's charts.

        Names match ``[A-Za-z_][A-Za-z0-9_./-]{0,63}`` (pass ``**{"val/loss": x}``
        for the ones Python keywords cannot spell).  Only rank 0's calls are
        published (every worker runs the same loop); all ranks check their
        values, so a bad one fails everywhere alike.  Points are sent at most
        once a second and when training ends.
        """
        leading_rank = not self.view.members or self.me not in self.members or self.rank == 0
        self.outputs.log_metrics(step, values, publish_it=leading_rank)

    # -- the end -------------------------------------------------------------------------
    def _finish(self) -> None:
        if self.exit_reason is None:
            self.exit_reason = "finished"
        self.outputs.flush()
        ending = self.exit_reason in ("finished", "stopped")
        if ending and self.me in self.members and self.training is not None:
            # rank 0's checkpoint comes before the finished event: the job resumes or
            # is downloaded from it ("final" once training ran to its end)
            self.transfer.save_at_end(self.training, self.rank, self.exit_reason == "finished")
        leader = self._leading()
        if leader is not None:
            if ending and self.members and self.rank != 0:
                self.transfer.wait_for_end_checkpoint(self.members[0])
            leader.on_finish(self.exit_reason)
        self._beat.stop()
        self.redis.delete(self.keys.alive(self.me))
        if self._step_log is not None:
            self._step_log.close()
            self._step_log = None

    def _why_abandon(self) -> str | None:
        """Why this worker's rendezvous should stop waiting (None: it should not)."""
        return "the job ended before this worker could join it" if self.left_behind() else None

    def left_behind(self) -> bool:
        """Whether this is a newcomer, not yet training, whose job has ended.

        A scale-out decided just before the last step: the members finish and
        exit while the newcomer builds its generation or waits for the state,
        so what it was waiting on breaks (a closed connection, a group that
        cannot be built). Nothing failed; it has nothing to do.
        """
        registration: Registration | None = getattr(self, "_registration", None)  # in __init__
        if self.opts.initial_world is not None or self.state != "starting" or registration is None:
            return False
        try:
            return registration.job_ended()
        except Exception:  # Redis unreachable: not known to have ended
            return False

    def fail(self, error: str) -> None:
        """Report that this worker cannot continue (the process then exits non-zero)."""
        try:
            with contextlib.suppress(Exception):  # the failure matters more than the metrics
                self.outputs.flush()
            publish(self.redis, self.keys, FailedEvent(worker=self.me, error=error))
        finally:
            self._beat.stop()
