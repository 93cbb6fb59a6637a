"""The job leader: a thread inside whichever worker holds the Redis lease.

It keeps the lease fresh, answers registrations (the RPC list
``edl:{job}:rpc``, replies on ``edl:{job}:reply:{worker}``), reads control
requests (stream ``edl:{job}:control``), and runs one membership operation at
a time:

1. *prepare*: publish the next generation (members, joiners, leavers); each
   of its members builds the new process group in the background and adds
   itself to ``edl:{job}:ready:{g}``.
2. *switch*: once all are ready, publish ``k = ceil(T_a / T_b)``; every member
   learns it at the same mini-batch ``t`` (through the control slot of the
   gradient all-reduce) and switches at the end of mini-batch ``t + k``.

It also drives failure recovery (``leader_recovery.py``), straggler reports,
profiling (``profiling.py``), and writes the job's metadata hash, which a
successor reads when it takes over (``LeaderMeta``).

The leader reads its worker through ``JobView`` only (``views.py``): it does not
import the context, which imports it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Literal

import redis

from workers.clock import Clock
from workers.elastic.constants import log
from workers.elastic.control import publish
from workers.elastic.leader_meta import LeaderMeta
from workers.elastic.leader_recovery import coordinate_recovery
from workers.elastic.lease import Lease
from workers.elastic.messages import (
    ControlRequest,
    JoinersRequest,
    MigrateRequest,
    PreparePlan,
    ProfileRequest,
    RankOrderRequest,
    ScaleInRequest,
    StopPlan,
    StopRequest,
    SwitchPlan,
    request_from_entry,
    rpc_from_json,
)
from workers.elastic.profiling import Profiler
from workers.elastic.ranks import order_by_rank, parse_ranks, write_rank_order
from workers.elastic.redis_io import hash_fields, read_stream, text, text_or_none
from workers.elastic.reporting import JobReporter
from workers.elastic.straggler import parse_rule
from workers.elastic.views import JobView
from workers.runtime_events import FinishedEvent
from workers.schema import ProtocolError

TICK_S = 0.02
NUDGE_TTL_S = 120
"""How long an unread nudge (a member told to read a prepare plan) is kept."""
JOIN_BATCH_WAIT_S = 30.0
"""How long newcomers announced together wait for each other before the first of them
join alone (a newcomer's start-up takes 3-20 s here; one that never comes holds no one
longer than this)."""


@dataclass(frozen=True)
class Operation:
    """The membership operation in progress: its phase, its plan, since when (monotonic)."""

    phase: Literal["prepare", "switch", "stopping"]
    plan: PreparePlan | None = None
    since: float = 0.0


class Leader:
    """Leader duties of one job, run by a daemon thread of the lease holder."""

    def __init__(self, view: JobView, client: redis.Redis, clock: Clock) -> None:
        self.view = view
        self.keys = view.keys
        self.redis = client
        self.clock = clock
        self.lease = Lease(client, self.keys, view.me, clock)
        self.active = True
        self.lock = threading.RLock()
        self.published_seq = int(self.redis.get(self.keys.plan_seq) or 0)
        self.meta = LeaderMeta.read(client, self.keys, view.me)
        self.profiler = Profiler(self)
        self.pending: list[str] = []
        self.announced: dict[str, float] = {}  # newcomer -> until when its batch waits for it
        self.op: Operation | None = None
        self.reports = JobReporter(
            client, self.keys, self.meta, clock, parse_rule(view.opts.straggler_rule)
        )
        self._thread = threading.Thread(target=self._run, daemon=True, name="edl-leader")

    def start(self) -> None:
        """Write the metadata and start the leader thread."""
        self.save_meta()
        self._thread.start()

    # -- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        while self.active:
            try:
                self.tick()
            except redis.RedisError as exc:
                log(self.view.me, f"leader: redis error {exc}")
            except Exception as exc:  # a leader bug must not kill training silently
                log(self.view.me, f"leader: {type(exc).__name__}: {exc}")
            self.clock.sleep(TICK_S)

    def refresh_lease(self) -> bool:
        """Extend the lease (every 0.5 s at most); False once another worker holds it."""
        if not self.lease.refresh():
            log(self.view.me, "lost the leader lease")
            self.active = False
            return False
        return True

    def tick(self) -> None:
        """One pass: lease, registrations, control requests, then the operation in progress."""
        if not self.refresh_lease():
            return
        with self.lock:
            self._drain_rpc()
            self._read_control()
            gen = self.view.generation
            if (
                gen >= 0
                and self.redis.exists(self.keys.survivors(gen))
                and not self.redis.exists(self.keys.recovery(gen))
            ):
                coordinate_recovery(self)
                return
            if self.view.state != "running":
                return
            if self.op is None:
                self._next_op()
            elif self.op.phase == "prepare":
                self._check_ready()

    def _drain_rpc(self) -> None:
        while (raw := text_or_none(self.redis.lpop(self.keys.rpc))) is not None:
            try:
                worker = rpc_from_json(raw).worker
            except ProtocolError as exc:
                log(self.view.me, f"leader: dropped an RPC request: {exc}")
                continue
            if worker not in self.view.members and worker not in self.pending:
                self.pending.append(worker)

    def _read_control(self) -> None:
        entries = read_stream(self.redis, self.keys.control, self.meta.cursor, 100)
        for entry_id, fields in entries:
            self.meta.cursor = entry_id
            try:
                self.meta.queue.append(request_from_entry(fields))
            except ProtocolError as exc:
                log(self.view.me, f"leader: dropped control request {entry_id}: {exc}")
        if entries:
            self.save_meta()

    # -- operations ------------------------------------------------------------------------
    def _next_op(self) -> None:
        queue = self.meta.queue
        while queue:
            request = queue[0]
            if self._start(request):
                return
        if self.profiler.active:
            self.profiler.tick()
            return
        if self.pending and not self._batch_incomplete():
            joiners, self.pending = self.pending, []
            for worker in joiners:
                self.announced.pop(worker, None)
            self.prepare([], joiners, "scale_out")

    def _batch_incomplete(self) -> bool:
        """Whether registered newcomers wait for others announced with them (one switch for all).

        The newcomers of a change are announced before they start: the new
        plan's rank order (``RankOrderRequest``, every node's agent sends it)
        names them, and an agent names those it starts together
        (``JoinersRequest``).  Admitted as each registers, the first would
        switch alone, and the control plane, told the switch is done, would
        free the GPUs of the others while they are still starting (bench run
        2026-12-03 21:57, j17: 2→3, then 3→4 a second later on a GPU it no
        longer held).  The wait lapses after ``JOIN_BATCH_WAIT_S``;
        unannounced newcomers never wait.
        """
        now = self.clock.monotonic()
        members = set(self.view.members)
        self.announced = {
            worker: until
            for worker, until in self.announced.items()
            if until > now and worker not in members
        }
        if not any(worker in self.announced for worker in self.pending):
            return False
        return any(worker not in self.pending for worker in self.announced)

    def _start(self, request: ControlRequest) -> bool:
        """Start the operation of the first queued request; True if one started or must wait."""
        view, queue = self.view, self.meta.queue
        if isinstance(request, StopRequest):
            queue.pop(0)
            self._publish(
                StopPlan(base_generation=view.generation, k=self._k(), reason=request.reason)
            )
            self.op = Operation("stopping")
            self.set_state("stopping")
            return True
        if isinstance(request, ScaleInRequest | MigrateRequest):
            leavers = [w for w in request.workers if w in view.members]
            want = request.joiners if isinstance(request, MigrateRequest) else 0
            if len(self.pending) < want:
                return True  # hold the switch until the announced joiners registered
            queue.pop(0)
            joiners = self.pending[:want]
            if len(leavers) >= view.world and not joiners:
                log(view.me, "scale-in of every worker refused: use stop")
                return False
            if not leavers and not joiners:
                # Said, so that a control plane waiting for this switch can be traced here.
                log(
                    view.me,
                    f"{request.reason or 'a request'}: none of {list(request.workers)} is a "
                    f"member of generation {view.generation} ({list(view.members)}): dropped",
                )
                return False
            self.pending = self.pending[len(joiners) :]
            self.prepare(leavers, joiners, request.reason)
            return True
        if isinstance(request, ProfileRequest):
            queue.pop(0)
            self.profiler.begin(request)
            return True
        if isinstance(request, RankOrderRequest):
            queue.pop(0)  # the next prepare (this request's change) orders by it
            write_rank_order(self.redis, self.keys, request.workers)
            log(view.me, f"rank order of the new plan: {list(request.workers)}")
            self._announce(request.workers)  # its newcomers, on whichever nodes they start
            return False
        assert isinstance(request, JoinersRequest)
        queue.pop(0)  # announced newcomers: the next scale-out waits for all of them
        self._announce(request.workers)
        return False

    def _announce(self, workers: tuple[str, ...]) -> None:
        """Expect the non-members among ``workers`` to register for one switch together."""
        until = self.clock.monotonic() + JOIN_BATCH_WAIT_S
        for worker in workers:
            if worker not in self.view.members and worker not in self.announced:
                self.announced[worker] = until

    def prepare(self, leavers: list[str], joiners: list[str], reason: str) -> None:
        """Publish the next generation: the members without ``leavers``, with ``joiners``,
        in the allocation's rank order (``ranks.py``; unranked ones last)."""
        view = self.view
        gen = int(self.redis.incr(self.keys.gen_counter))
        staying = [w for w in view.members if w not in leavers]
        ranks = parse_ranks(hash_fields(self.redis, self.keys.ranks()))
        members = order_by_rank(staying + joiners, ranks)
        plan = PreparePlan(
            generation=gen,
            base_generation=view.generation,
            members=members,
            joiners=tuple(joiners),
            leavers=tuple(leavers),
            # the state comes from the first member (in rank order) that has it
            source=next((i for i, w in enumerate(members) if w in staying), 0),
            # Every worker moves: no member can broadcast the state, so the leaving
            # leader leaves it in Redis at the switch and the newcomers load it from there.
            handoff=not staying,
            reason=reason,
        )
        self._publish(plan)
        for worker in joiners:
            self.redis.rpush(self.keys.reply(worker), plan.to_json())
        # The staying members build the new group as soon as they read this, rather than
        # at their next all-reduce (PlanFollower.watch_nudges): a newcomer is ready sooner.
        for worker in staying:
            nudge = self.keys.nudge(worker)
            self.redis.rpush(nudge, self.published_seq)
            self.redis.expire(nudge, NUDGE_TTL_S)
        self.op = Operation("prepare", plan, self.clock.monotonic())
        self.set_state("profiling" if self.profiler.active else "scaling")
        log(view.me, f"preparing generation {gen}: +{joiners} -{leavers}")

    def _check_ready(self) -> None:
        assert self.op is not None and self.op.plan is not None
        plan = self.op.plan
        ready = {text(w) for w in self.redis.smembers(self.keys.ready(plan.generation))}
        if set(plan.members) <= set(ready):
            switch = SwitchPlan.of(plan, self._k())
            self._publish(switch)
            self.op = Operation("switch", switch, self.clock.monotonic())
        elif self.clock.monotonic() - self.op.since > 2 * self.view.opts.sync_timeout_s + 30:
            missing = sorted(set(plan.members) - set(ready))
            log(self.view.me, f"generation {plan.generation} never got ready: {missing}")
            self.op = None
            self.set_state("running")

    def _k(self) -> int:
        t_b = self.view.batch_time()
        t_a = self.view.opts.scale_lead_ms / 1000.0
        return max(1, math.ceil(t_a / t_b)) if t_b > 0 else 1

    def _publish(self, plan: PreparePlan | StopPlan) -> None:
        seq = int(self.redis.incr(self.keys.plan_seq))
        self.redis.set(self.keys.plan(seq), plan.to_json())
        self.published_seq = seq

    # -- called by the main thread ---------------------------------------------------------
    def on_switched(self, plan: SwitchPlan, pause_s: float) -> None:
        """The main thread moved to ``plan``'s generation."""
        with self.lock:
            self.reports.scale_done(plan, pause_s, self.view.step)
            self.op = None
            self.profiler.restart_level()
            self.set_state("profiling" if self.profiler.active else "running")

    def hand_off(self, successor: str, plan: SwitchPlan) -> None:
        """This worker leaves at this switch: pass the lease (and the metadata) on."""
        with self.lock:
            self.active = False
            self.op = None
            self.reports.scale_done(plan, 0.0, self.view.step, new_leader=successor)
            self.meta.save_membership(plan.generation, list(plan.members))
            self.save_meta(generation=False)
            self.lease.hand_to(successor)
        log(self.view.me, f"handed the lead to {successor}")

    def observe_times(self, times: dict[str, float]) -> None:
        """Per-worker compute times of the mini-batch just synchronised."""
        view = self.view
        for worker in self.reports.new_stragglers(view, times):
            if view.opts.drop_stragglers and view.world > 1:
                with self.lock:
                    self.meta.queue.append(ScaleInRequest(workers=(worker,), reason="straggler"))

    def on_step(self) -> None:
        """After each committed mini-batch: metadata and progress."""
        self.reports.step_done(self.view)

    def on_finish(self, reason: str) -> None:
        """Training ended (or everyone stops): final status, then drop the coordination keys."""
        with self.lock:
            self.active = False
            if reason in ("finished", "stopped"):
                self.set_state(reason)
                publish(self.redis, self.keys, FinishedEvent(step=self.view.step, reason=reason))
                keep = {self.keys.meta, self.keys.events}
                doomed = [
                    k for k in self.redis.scan_iter(match=self.keys.prefix + "*") if k not in keep
                ]
                if doomed:
                    self.redis.delete(*doomed)
                self.lease.tombstone()
            else:
                self.lease.release()

    # -- called by recovery --------------------------------------------------------------
    def after_recovery(self, plan_seq: int) -> None:
        """A recovery plan is out: drop the operation and registrations it voided."""
        self.op = None
        self.pending = []
        self.published_seq = plan_seq

    def resume_after_recovery(self) -> None:
        """The survivors are back: carry on (a profile restarts its level)."""
        self.profiler.restart_level()
        self.set_state("profiling" if self.profiler.active else "running")

    # -- metadata ---------------------------------------------------------------------------
    def set_state(self, state: str) -> None:
        """The job's state as ``JobControl.status()`` reports it."""
        self.redis.hset(self.keys.meta, "state", state)

    def save_meta(self, generation: bool = True) -> None:
        """Write what a successor needs (and, by default, the current membership)."""
        self.meta.save(self.view, self.profiler.state, generation=generation)
