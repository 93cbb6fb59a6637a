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
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import json
import math
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
import torch

from workers.elastic import checkpoint, comm
from workers.elastic.cli import WorkerOptions
from workers.elastic.control import emit_event
from workers.elastic.keys import JobKeys
from workers.elastic.sampler import ElasticSampler
from workers.elastic.store import RedisStore

LEASE_MS = 3000
ALIVE_MS = 3000
BEAT_S = 0.5
JOIN_WAIT_S = 600.0
CTRL_FIXED = 3  # plan seq, loss sum, sample count; then one compute time per rank


class ElasticError(RuntimeError):
    """The job cannot continue on this worker."""


@dataclass(frozen=True)
class Batch:
    """One global mini-batch as seen by this worker."""

    step: int
    epoch: int
    indices: np.ndarray


def log(worker: str, message: str) -> None:
    print(f"[edl {worker} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class ElasticContext:
    """Rank, world, device and generation of this worker, and the hooks of its loop."""

    def __init__(self, options: WorkerOptions) -> None:
        self.opts = options
        self.me = options.worker_id
        self.keys = JobKeys(options.job_id)
        self.redis = redis.Redis.from_url(options.redis_url, decode_responses=True)
        self.store = RedisStore(options.redis_url, self.keys.store())
        self.device = torch.device(options.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # membership (identical on every member after each step)
        self.generation = -1
        self.members: list[str] = []
        self.group: Any = None
        self.step = 0
        self.total_steps = 0
        self.plan_seen = 0
        self.exit_reason: str | None = None
        self.state = "starting"
        # planned actions keyed by the committed-step count at which they happen
        self._actions: dict[int, list[dict[str, Any]]] = {}
        self._building: dict[int, threading.Thread] = {}
        self._built: dict[int, Any] = {}
        self._build_error: dict[int, BaseException] = {}
        # observations for the leader
        self.last_loss = math.nan
        self.step_ends: deque[tuple[int, float]] = deque(maxlen=200)
        self.compute_times: deque[dict[str, float]] = deque(maxlen=50)
        self.last_pause_s = 0.0
        self._t_step = time.perf_counter()
        self._last_ckpt_t = time.monotonic()
        self.leader: Any = None  # a workers.elastic.leader.Leader while this worker leads
        self._stop_beat = threading.Event()
        self._lead_lock = threading.Lock()
        self._step_log = open(options.step_log, "a") if options.step_log else None  # noqa: SIM115
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.sampler: ElasticSampler | None = None
        self._joiner_plan: dict[str, Any] | None = None
        self._registration = threading.Thread(
            target=self._register, daemon=True, name="edl-register"
        )
        self._registration_error: BaseException | None = None
        self._registration.start()
        threading.Thread(target=self._beat, daemon=True, name="edl-beat").start()

    # -- properties -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.members.index(self.me)

    @property
    def world(self) -> int:
        return len(self.members)

    @property
    def is_leader(self) -> bool:
        return self.leader is not None and self.leader.active

    # -- background: registration and liveness ------------------------------------------
    def _register(self) -> None:
        """Find this worker's first generation and build its communicator (background)."""
        try:
            n = self.opts.initial_world
            if n is not None:
                slot = int(self.redis.incr(self.keys.k("gen0slot"))) - 1
                if slot < n:
                    self.redis.hset(self.keys.k("gen0members"), str(slot), self.me)
                    deadline = time.monotonic() + self.opts.sync_timeout_s * 4
                    while self.redis.hlen(self.keys.k("gen0members")) < n:
                        if time.monotonic() > deadline:
                            raise ElasticError("generation 0 did not fill up")
                        time.sleep(0.02)
                    by_slot = self.redis.hgetall(self.keys.k("gen0members"))
                    members = [by_slot[str(i)] for i in range(n)]
                    plan = {"generation": 0, "members": members, "joiners": [], "gen0": True}
                    self._joiner_plan = plan
                    self._build(plan)
                    return
            # a newcomer: register with the leader over the RPC list, wait for its answer
            while True:
                self.redis.rpush(self.keys.rpc, json.dumps({"op": "register", "worker": self.me}))
                reply = self.redis.blpop([self.keys.reply(self.me)], timeout=300)
                if reply is None:
                    raise ElasticError("no leader answered the registration")
                plan = json.loads(reply[1])
                if plan.get("op") == "refused":
                    raise ElasticError(f"registration refused: {plan.get('reason')}")
                self._joiner_plan = plan
                self._build(plan)
                if plan["generation"] in self._built:
                    return
                log(self.me, f"generation {plan['generation']} failed to build; registering again")
        except BaseException as exc:  # surfaced to the main thread by attach()
            self._registration_error = exc

    def _build(self, plan: dict[str, Any]) -> None:
        """Build the process group of ``plan`` (blocking) and tell the leader we are ready."""
        gen = plan["generation"]
        try:
            group = comm.build_group(
                self.store,
                gen,
                plan["members"].index(self.me),
                len(plan["members"]),
                self.device,
                self.opts.sync_timeout_s,
            )
        except Exception as exc:
            self._build_error[gen] = exc
            return
        self._built[gen] = group

    def _build_in_background(self, plan: dict[str, Any]) -> None:
        gen = plan["generation"]
        if gen in self._building:
            return

        def run() -> None:
            self._build(plan)
            if gen in self._built:
                self.redis.sadd(self.keys.ready(gen), self.me)

        thread = threading.Thread(target=run, daemon=True, name=f"edl-build-{gen}")
        self._building[gen] = thread
        thread.start()

    def _beat(self) -> None:
        """Keep the liveness key fresh; take the leader lease when it lapses."""
        while not self._stop_beat.is_set():
            try:
                self.redis.set(self.keys.alive(self.me), "1", px=ALIVE_MS)
                eligible = (
                    self.state in ("running", "recovering")
                    and self.exit_reason is None
                    and self.step < self.total_steps
                )
                if eligible and not self.is_leader:
                    # a lapsed lease (leader died) or one handed to us (leader left)
                    taken = self.redis.set(self.keys.leader, self.me, nx=True, px=LEASE_MS)
                    if taken or self.redis.get(self.keys.leader) == self.me:
                        self._become_leader()
            except redis.RedisError as exc:
                log(self.me, f"redis unavailable: {exc}")
            self._stop_beat.wait(BEAT_S)

    def _become_leader(self) -> None:
        with self._lead_lock:
            if self.is_leader:
                return
            self._start_leading()

    def _start_leading(self) -> None:
        from workers.elastic.leader import Leader

        log(self.me, f"leader of generation {self.generation}")
        self.leader = Leader(self)
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
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.total_steps = (
            total_steps if self.opts.max_steps is None else min(total_steps, self.opts.max_steps)
        )
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._registration.join()
        if self._registration_error is not None:
            raise ElasticError(f"could not join: {self._registration_error}")
        plan = self._joiner_plan
        assert plan is not None
        gen = plan["generation"]
        group = self._built.pop(gen, None)
        if group is None:
            raise ElasticError(f"generation {gen} could not be built: {self._build_error.get(gen)}")
        self.group, self.generation, self.members = group, gen, list(plan["members"])
        if plan.get("gen0"):
            if self.rank == 0:
                if self.redis.get(self.keys.leader) == "__finished__":  # restart of a stopped job
                    self.redis.delete(self.keys.leader)
                self.redis.set(self.keys.leader, self.me, nx=True, px=LEASE_MS)
            restored = None
            if self.rank == 0:
                restored = checkpoint.load_latest(self.opts.checkpoint_dir, self.opts.job_id)
                if restored is not None:  # a restarted job: earlier plans are void
                    restored.update(plan_seen=0, actions={})
            state = self._state() if restored is None else restored
            state = comm.broadcast_state(
                self.group, state if self.rank == 0 else None, 0, self.device
            )
            self._load_state(state, restored is not None or self.rank != 0)
            if restored is None:
                self._maybe_checkpoint(force=True)  # consistent recovery needs a step to go back to
            if self.redis.get(self.keys.leader) == self.me:
                self._become_leader()
        else:
            # ready: the model is prepared and the communicator built; wait for the switch
            self.redis.sadd(self.keys.ready(gen), self.me)
            # a newcomer may wait here for several mini-batches (the leader's k, others' readiness)
            if plan.get("handoff"):
                state = self._take_state(gen)
            else:
                state = comm.broadcast_state(
                    self.group, None, plan["source"], self.device, timeout_s=JOIN_WAIT_S
                )
            self._load_state(state, True)
            if self.redis.get(self.keys.leader) == self.me:
                self._become_leader()
        self.state = "running"
        self._t_step = time.perf_counter()
        self.step_ends.append((self.step, time.perf_counter()))
        log(self.me, f"training: generation {gen}, rank {self.rank}/{self.world}, step {self.step}")

    def _leave_state(self, generation: int) -> None:
        """Leave the training state in Redis for newcomers that replace every worker."""
        buffer = io.BytesIO()
        torch.save(self._state(), buffer)
        raw = redis.Redis.from_url(self.opts.redis_url)
        raw.set(self.keys.handoff(generation), buffer.getvalue(), ex=int(JOIN_WAIT_S))
        log(self.me, f"left the state for generation {generation} ({buffer.tell()} bytes)")

    def _take_state(self, generation: int) -> dict[str, Any]:
        """Wait for the state the last leader left at the switch, and read it."""
        raw = redis.Redis.from_url(self.opts.redis_url)
        deadline = time.monotonic() + JOIN_WAIT_S
        while (blob := raw.get(self.keys.handoff(generation))) is None:
            if time.monotonic() > deadline:
                raise ElasticError(f"no state was left for generation {generation}")
            time.sleep(0.05)
        state: dict[str, Any] = torch.load(io.BytesIO(blob), map_location=self.device)
        return state

    def _state(self) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "plan_seen": self.plan_seen,
            "actions": self._actions,
        }

    def _load_state(self, state: dict[str, Any], load_tensors: bool) -> None:
        assert self.model is not None and self.optimizer is not None
        if load_tensors:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.plan_seen = int(state.get("plan_seen", self.plan_seen))
        self._actions = {int(k): v for k, v in state.get("actions", {}).items()}

    # -- the loop ----------------------------------------------------------------------
    def steps(self) -> Iterator[Batch]:
        """Yield this worker's share of each global mini-batch until training ends or it leaves."""
        assert self.sampler is not None
        while self.exit_reason is None and self.step < self.total_steps:
            self._t_step = time.perf_counter()
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
        if self.opts.slow_ms > 0:
            time.sleep(self.opts.slow_ms / 1000.0)  # injected straggler (tests, benchmarks)
        compute_s = time.perf_counter() - self._t_step
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        ctrl = torch.zeros(CTRL_FIXED + self.world, dtype=grads[0].dtype, device=self.device)
        ctrl[0] = float(self.leader.published_seq) if self.is_leader else 0.0
        ctrl[1] = float(loss_sum)
        ctrl[2] = float(local_count)
        ctrl[CTRL_FIXED + self.rank] = compute_s
        flat = torch.cat([g.reshape(-1) for g in grads] + [ctrl])
        try:
            comm.allreduce_sum(self.group, flat)
        except Exception as exc:
            self._recover(exc)
            return False
        ctrl = flat[-(CTRL_FIXED + self.world) :].cpu()
        total = float(ctrl[2])
        flat = flat[: -(CTRL_FIXED + self.world)]
        if total > 0:
            flat.div_(total)
        offset = 0
        for p in self._params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
        self.last_loss = float(ctrl[1]) / total if total > 0 else math.nan
        times = {w: float(ctrl[CTRL_FIXED + i]) for i, w in enumerate(self.members)}
        self.compute_times.append(times)
        if self.is_leader:
            self.leader.observe_times(times)
        seq = round(float(ctrl[0]))
        while self.plan_seen < seq:
            self.plan_seen += 1
            raw = self.redis.get(self.keys.plan(self.plan_seen))
            if raw is not None:
                self._accept_plan(json.loads(raw))
        return True

    def _accept_plan(self, plan: dict[str, Any]) -> None:
        """Act on a plan that every member learned at this same mini-batch."""
        kind = plan["kind"]
        if plan.get("base_generation", self.generation) != self.generation:
            return  # issued for an older membership
        if kind == "prepare":
            if self.me in plan["members"]:
                self._build_in_background(plan)
        elif kind in ("switch", "stop"):
            at = self.step + int(plan["k"])
            self._actions.setdefault(at, []).append(plan)

    def notify_batch_end(self) -> None:
        """Commit the mini-batch: report, checkpoint, and switch or leave at the agreed step."""
        assert self.sampler is not None
        self.step += 1
        now = time.perf_counter()
        self.step_ends.append((self.step, now))
        if self._step_log is not None:
            record = {
                "step": self.step - 1,
                "epoch": self.sampler.epoch_of(self.step - 1),
                "gen": self.generation,
                "rank": self.rank,
                "world": self.world,
                "worker": self.me,
                "t": time.time(),
                "loss": self.last_loss,
                "indices": self.sampler.local_indices(
                    self.step - 1, self.rank, self.world
                ).tolist(),
            }
            self._step_log.write(json.dumps(record) + "\n")
            self._step_log.flush()
        if self.is_leader:
            self.leader.on_step()
        self._maybe_checkpoint()
        for plan in self._actions.pop(self.step, []):
            if plan["kind"] == "switch":
                self._switch(plan)
            elif plan["kind"] == "stop":
                self.exit_reason = "stopped"

    def _maybe_checkpoint(self, force: bool = False) -> None:
        if self.rank != 0:
            return
        every = self.opts.checkpoint_every
        minutes = self.opts.checkpoint_minutes
        due = force or (every > 0 and self.step % every == 0)
        if minutes is not None and time.monotonic() - self._last_ckpt_t >= minutes * 60:
            due = True
        if due:
            checkpoint.save(self.opts.checkpoint_dir, self.opts.job_id, self.step, self._state())
            self._last_ckpt_t = time.monotonic()

    def _switch(self, plan: dict[str, Any]) -> None:
        """Move to the plan's generation: leavers leave, the rest swap communicators."""
        gen = plan["generation"]
        if self.me not in plan["members"]:
            if self.is_leader:
                if plan.get("handoff"):
                    self._leave_state(gen)
                self.leader.hand_off(plan["members"][0], plan)
            self.exit_reason = "left"
            log(self.me, f"leaving at step {self.step} (generation {gen})")
            return
        t0 = time.perf_counter()
        thread = self._building.pop(gen, None)
        if thread is not None:
            thread.join()
        group = self._built.pop(gen, None)
        if group is None:
            raise ElasticError(f"generation {gen} was not built: {self._build_error.get(gen)}")
        old = self.group
        self.group, self.generation, self.members = group, gen, list(plan["members"])
        if plan["joiners"]:
            mine = self._state() if self.rank == plan["source"] else None
            comm.broadcast_state(self.group, mine, plan["source"], self.device, want=False)
        self.last_pause_s = time.perf_counter() - t0
        self.redis.hset(self.keys.pauses(gen), self.me, self.last_pause_s)
        del old
        self._t_step = time.perf_counter()
        if self.is_leader:
            self.leader.on_switched(plan, self.last_pause_s)
        log(
            self.me,
            f"switched to generation {gen}: rank {self.rank}/{self.world} at step {self.step}",
        )

    # -- failure -------------------------------------------------------------------------
    def _recover(self, exc: BaseException) -> None:
        """A collective failed: report as a survivor, wait for the leader's plan, rebuild."""
        failed_gen = self.generation
        log(self.me, f"generation {failed_gen} failed at step {self.step}: {str(exc)[:160]}")
        self.state = "recovering"
        group, self.group = self.group, None
        with contextlib.suppress(Exception):  # best effort; the sync timeout is the fallback
            group.abort()
        # Dropping the last reference closes our connections, so that peers still blocked
        # on us in the same collective fail now instead of at their sync timeout.
        del group
        self._actions.clear()
        self.redis.hset(self.keys.survivors(failed_gen), self.me, self.step)
        deadline = time.monotonic() + self.opts.sync_timeout_s * 4 + 30
        while (raw := self.redis.get(self.keys.recovery(failed_gen))) is None:
            if time.monotonic() > deadline:
                raise ElasticError(f"no recovery plan for generation {failed_gen}")
            time.sleep(0.05)
        plan = json.loads(raw)
        if self.me not in plan["members"]:
            self.exit_reason = "dropped"
            return
        gen = plan["generation"]
        self._build(plan)
        group = self._built.pop(gen, None)
        if group is None:
            raise ElasticError(f"recovery generation {gen} failed: {self._build_error.get(gen)}")
        self.group, self.generation, self.members = group, gen, list(plan["members"])
        self.plan_seen = int(plan["plan_seq"])
        if plan["mode"] == "consistent":
            state = checkpoint.load_step(self.opts.checkpoint_dir, self.opts.job_id, plan["step"])
            self._load_state(state, True)
            self.plan_seen = int(plan["plan_seq"])
            self._actions.clear()
        else:
            mine = self._state() if self.rank == plan["source"] else None
            state = comm.broadcast_state(self.group, mine, plan["source"], self.device)
            self._load_state(state, self.rank != plan["source"])
        self.plan_seen = int(plan["plan_seq"])
        self._actions.clear()
        self.state = "running"
        self.redis.sadd(self.keys.k("recovered", gen), self.me)
        log(self.me, f"recovered ({plan['mode']}) into generation {gen} at step {self.step}")

    # -- the end -------------------------------------------------------------------------
    def _finish(self) -> None:
        if self.exit_reason is None:
            self.exit_reason = "finished"
        if self.exit_reason in ("finished", "stopped") and self.me in self.members:
            self._maybe_checkpoint(force=True)
        if self.is_leader:
            self.leader.on_finish(self.exit_reason)
        self._stop_beat.set()
        self.redis.delete(self.keys.alive(self.me))
        if self._step_log is not None:
            self._step_log.close()
            self._step_log = None

    # -- helpers for the leader --------------------------------------------------------
    def batch_time(self) -> float:
        """Median wall time of the recent mini-batches (``T_b``)."""
        ends = list(self.step_ends)
        gaps = [b[1] - a[1] for a, b in itertools.pairwise(ends) if b[0] == a[0] + 1]
        return statistics.median(gaps[-10:]) if gaps else 0.0

    def throughput_since(self, step: int) -> tuple[int, float]:
        """(mini-batches, seconds) between the end of ``step`` and the latest step end."""
        ends = list(self.step_ends)
        steps = [s for s, _ in ends]
        i = bisect.bisect_left(steps, step)
        if i >= len(ends) or ends[i][0] != step:
            return 0, 0.0
        return ends[-1][0] - step, ends[-1][1] - ends[i][1]

    def fail(self, error: str) -> None:
        """Report that this worker cannot continue (the process then exits non-zero)."""
        try:
            emit_event(self.redis, self.keys, "failed", worker=self.me, error=error)
        finally:
            self._stop_beat.set()
