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

It also drives failure recovery, straggler reports, profiling, and writes the
job's metadata hash, which a successor reads when it takes over.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from workers.elastic import checkpoint
from workers.elastic.context import ALIVE_MS, LEASE_MS, log
from workers.elastic.control import emit_event
from workers.elastic.straggler import StragglerDetector

if TYPE_CHECKING:
    from workers.elastic.context import ElasticContext

REFRESH_LEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
HAND_LEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end return 0"
)
PROGRESS_EVERY_S = 0.5
FINISHED = "__finished__"
WARMUP_STEPS = 2


class Leader:
    """Leader duties of one job, run by a daemon thread of the lease holder."""

    def __init__(self, ctx: ElasticContext) -> None:
        self.ctx = ctx
        self.keys = ctx.keys
        self.redis: redis.Redis = redis.Redis.from_url(ctx.opts.redis_url, decode_responses=True)
        self.active = True
        self.lock = threading.RLock()
        self.published_seq = int(self.redis.get(self.keys.plan_seq) or 0)
        meta = self.redis.hgetall(self.keys.meta)
        self.cursor = meta.get("cursor", "0")
        self.queue: list[dict[str, Any]] = json.loads(meta.get("queue", "[]"))
        self.curve: dict[str, float] = json.loads(meta.get("curve", "{}"))
        self.profile: dict[str, Any] | None = json.loads(meta.get("profile", "null"))
        self.pending: list[str] = []
        self.op: dict[str, Any] | None = None
        self.detector = StragglerDetector()
        self.reported: set[str] = set()
        self._last_progress = 0.0
        self._last_lease = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="edl-leader")

    def start(self) -> None:
        self._save_meta()
        self._thread.start()

    # -- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        while self.active:
            try:
                self._tick()
            except redis.RedisError as exc:
                log(self.ctx.me, f"leader: redis error {exc}")
            except Exception as exc:  # a leader bug must not kill training silently
                log(self.ctx.me, f"leader: {type(exc).__name__}: {exc}")
            time.sleep(0.02)

    def _refresh_lease(self) -> bool:
        """Extend the lease (every 0.5 s at most); False once another worker holds it."""
        now = time.monotonic()
        if now - self._last_lease > 0.5:
            if not self.redis.eval(REFRESH_LEASE, 1, self.keys.leader, self.ctx.me, LEASE_MS):
                log(self.ctx.me, "lost the leader lease")
                self.active = False
                return False
            self._last_lease = now
        return True

    def _tick(self) -> None:
        if not self._refresh_lease():
            return
        with self.lock:
            self._drain_rpc()
            self._read_control()
            gen = self.ctx.generation
            if (
                gen >= 0
                and self.redis.exists(self.keys.survivors(gen))
                and not self.redis.exists(self.keys.recovery(gen))
            ):
                self._recover()
                return
            if self.ctx.state != "running":
                return
            if self.op is None:
                self._next_op()
            elif self.op["phase"] == "prepare":
                self._check_ready()

    def _drain_rpc(self) -> None:
        while (raw := self.redis.lpop(self.keys.rpc)) is not None:
            msg = json.loads(raw)
            if msg.get("op") == "register":
                worker = msg["worker"]
                if worker not in self.ctx.members and worker not in self.pending:
                    self.pending.append(worker)

    def _read_control(self) -> None:
        answer = self.redis.xread({self.keys.control: self.cursor}, count=100)
        changed = False
        for _stream, entries in answer or []:
            for entry_id, fields in entries:
                self.cursor = entry_id
                request = json.loads(fields.get("payload", "{}"))
                request["kind"] = fields.get("kind")
                self.queue.append(request)
                changed = True
        if changed:
            self._save_meta()

    # -- operations ------------------------------------------------------------------------
    def _next_op(self) -> None:
        ctx = self.ctx
        while self.queue:
            request = self.queue[0]
            kind = request["kind"]
            if kind == "stop":
                self.queue.pop(0)
                self._publish({"kind": "stop", "k": self._k(), "reason": request.get("reason")})
                self.op = {"phase": "stopping"}
                self._set_state("stopping")
                return
            if kind in ("scale_in", "migrate"):
                leavers = [w for w in request["workers"] if w in ctx.members]
                want = int(request.get("joiners", 0))
                if kind == "migrate" and len(self.pending) < want:
                    return  # hold the switch until the announced joiners registered
                self.queue.pop(0)
                joiners = self.pending[:want] if kind == "migrate" else []
                if len(leavers) >= ctx.world and not joiners:
                    log(ctx.me, "scale-in of every worker refused: use stop")
                    continue
                if not leavers and not joiners:
                    continue
                self.pending = self.pending[len(joiners) :]
                self._prepare(leavers, joiners, request.get("reason", kind))
                return
            if kind == "profile":
                self.queue.pop(0)
                lo, hi = int(request["min"]), int(request["max"])
                self.profile = {"min": lo, "max": hi, "batches": int(request["batches"])}
                self.curve = {}
                if ctx.world > hi:
                    extra = [w for w in reversed(ctx.members) if w != ctx.me][: ctx.world - hi]
                    self._prepare(extra, [], "profile")
                else:
                    self.profile["start"] = ctx.step + WARMUP_STEPS
                self._set_state("profiling")
                return
            self.queue.pop(0)  # "joiners" and unknown kinds: nothing to hold
        if self.profile is not None:
            self._profile_tick()
            return
        if self.pending:
            joiners, self.pending = self.pending, []
            self._prepare([], joiners, "scale_out")

    def _prepare(self, leavers: list[str], joiners: list[str], reason: str) -> None:
        ctx = self.ctx
        gen = int(self.redis.incr(self.keys.gen_counter))
        staying = [w for w in ctx.members if w not in leavers]
        members = staying + joiners
        plan = {
            "kind": "prepare",
            "generation": gen,
            "base_generation": ctx.generation,
            "members": members,
            "joiners": joiners,
            "leavers": leavers,
            "source": 0,
            # Every worker moves: no member can broadcast the state, so the leaving
            # leader leaves it in Redis at the switch and the newcomers load it from there.
            "handoff": not staying,
            "reason": reason,
        }
        self._publish(plan)
        for worker in joiners:
            self.redis.rpush(self.keys.reply(worker), json.dumps(plan))
        self.op = {"phase": "prepare", "plan": plan, "since": time.monotonic()}
        self._set_state("scaling" if self.profile is None else "profiling")
        log(ctx.me, f"preparing generation {gen}: +{joiners} -{leavers}")

    def _check_ready(self) -> None:
        assert self.op is not None
        plan = self.op["plan"]
        ready = self.redis.smembers(self.keys.ready(plan["generation"]))
        if set(plan["members"]) <= set(ready):
            switch = dict(plan, kind="switch", k=self._k())
            self._publish(switch)
            self.op = {"phase": "switch", "plan": switch, "since": time.monotonic()}
        elif time.monotonic() - self.op["since"] > 2 * self.ctx.opts.sync_timeout_s + 30:
            missing = sorted(set(plan["members"]) - set(ready))
            log(self.ctx.me, f"generation {plan['generation']} never got ready: {missing}")
            self.op = None
            self._set_state("running")

    def _k(self) -> int:
        t_b = self.ctx.batch_time()
        t_a = self.ctx.opts.scale_lead_ms / 1000.0
        return max(1, math.ceil(t_a / t_b)) if t_b > 0 else 1

    def _publish(self, plan: dict[str, Any]) -> None:
        plan.setdefault("base_generation", self.ctx.generation)
        seq = int(self.redis.incr(self.keys.plan_seq))
        self.redis.set(self.keys.plan(seq), json.dumps(plan))
        self.published_seq = seq

    # -- called by the main thread ---------------------------------------------------------
    def on_switched(self, plan: dict[str, Any], pause_s: float) -> None:
        """The main thread moved to ``plan``'s generation."""
        with self.lock:
            self.detector.reset()
            self._emit_scale_done(plan, pause_s)
            self.op = None
            if self.profile is not None:
                self.profile["start"] = self.ctx.step + WARMUP_STEPS
            self._set_state("running" if self.profile is None else "profiling")

    def _emit_scale_done(self, plan: dict[str, Any], pause_s: float, **extra: Any) -> None:
        """Tell the world (the agent, the control plane) that ``plan``'s switch happened."""
        emit_event(
            self.redis,
            self.keys,
            "scale_done",
            generation=plan["generation"],
            world=len(plan["members"]),
            members=plan["members"],
            joiners=plan["joiners"],
            leavers=plan["leavers"],
            pause_s=pause_s,
            step=self.ctx.step,
            **extra,
        )

    def hand_off(self, successor: str, plan: dict[str, Any]) -> None:
        """This worker leaves at this switch: pass the lease (and the metadata) on."""
        with self.lock:
            self.active = False
            self.op = None
            self._emit_scale_done(plan, 0.0, new_leader=successor)
            self.redis.hset(
                self.keys.meta,
                mapping={"generation": plan["generation"], "members": json.dumps(plan["members"])},
            )
            self._save_meta(generation=False)
            self.redis.eval(HAND_LEASE, 1, self.keys.leader, self.ctx.me, successor, LEASE_MS)
        log(self.ctx.me, f"handed the lead to {successor}")

    def observe_times(self, times: dict[str, float]) -> None:
        """Per-worker compute times of the mini-batch just synchronised."""
        for worker, ratio in self.detector.observe(times):
            if worker in self.reported:
                continue
            self.reported.add(worker)
            emit_event(
                self.redis, self.keys, "straggler", worker=worker, ratio=ratio, step=self.ctx.step
            )
            log(self.ctx.me, f"straggler {worker} ({ratio:.2f}x median)")
            if self.ctx.opts.drop_stragglers and self.ctx.world > 1:
                with self.lock:
                    self.queue.append(
                        {"kind": "scale_in", "workers": [worker], "reason": "straggler"}
                    )

    def on_step(self) -> None:
        """After each committed mini-batch: metadata and progress."""
        ctx = self.ctx
        t_b = ctx.batch_time()
        sps = ctx.opts.batch_size / t_b if t_b > 0 else 0.0
        self.redis.hset(
            self.keys.meta,
            mapping={
                "step": ctx.step,
                "epoch": ctx.sampler.epoch_of(ctx.step) if ctx.sampler else 0,
                "samples_per_s": sps,
                "last_loss": ctx.last_loss,
                "generation": ctx.generation,
                "members": json.dumps(ctx.members),
                "global_batch": ctx.opts.batch_size,
            },
        )
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            emit_event(
                self.redis,
                self.keys,
                "progress",
                step=ctx.step,
                samples_per_s=sps,
                loss=ctx.last_loss,
                world=ctx.world,
                generation=ctx.generation,
            )

    def on_finish(self, reason: str) -> None:
        """Training ended (or everyone stops): final status, then drop the coordination keys."""
        with self.lock:
            self.active = False
            if reason in ("finished", "stopped"):
                self._set_state(reason)
                emit_event(self.redis, self.keys, "finished", step=self.ctx.step, reason=reason)
                keep = {self.keys.meta, self.keys.events}
                doomed = [
                    k for k in self.redis.scan_iter(match=self.keys.prefix + "*") if k not in keep
                ]
                if doomed:
                    self.redis.delete(*doomed)
                # a tombstone lease, so that peers finishing a moment later do not take over
                self.redis.set(self.keys.leader, FINISHED, px=30_000)
            else:
                self.redis.eval(REFRESH_LEASE, 1, self.keys.leader, self.ctx.me, 1)

    # -- profiling ---------------------------------------------------------------------------
    def _profile_tick(self) -> None:
        ctx = self.ctx
        prof = self.profile
        assert prof is not None
        start = prof.get("start")
        if start is None or ctx.step < start + prof["batches"]:
            return
        batches, seconds = ctx.throughput_since(start)
        if batches <= 0 or seconds <= 0:
            return
        self.curve[str(ctx.world)] = ctx.opts.batch_size * batches / seconds
        log(ctx.me, f"profile: {ctx.world} workers -> {self.curve[str(ctx.world)]:.1f} samples/s")
        if ctx.world > prof["min"]:
            leaver = next(w for w in reversed(ctx.members) if w != ctx.me)
            prof["start"] = None
            self._prepare([leaver], [], "profile")
        else:
            curve = {int(n): v for n, v in self.curve.items()}
            self.profile = None
            self._save_meta()
            self._set_state("running")
            emit_event(self.redis, self.keys, "profile_done", curve=curve)
        self._save_meta()

    # -- failure -------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Some member saw generation g fail: wait for every member to report or expire."""
        ctx = self.ctx
        failed = ctx.generation
        members = list(ctx.members)
        self._set_state("recovering")
        deadline = time.monotonic() + ctx.opts.sync_timeout_s + 2 * ALIVE_MS / 1000 + 5
        while True:
            survivors = self.redis.hgetall(self.keys.survivors(failed))
            dead = [
                m
                for m in members
                if m not in survivors and not self.redis.exists(self.keys.alive(m))
            ]
            if len(survivors) + len(dead) >= len(members) or time.monotonic() > deadline:
                break
            if not self._refresh_lease():
                return
            time.sleep(0.05)
        alive = [m for m in members if m in survivors]
        dead = [m for m in members if m not in survivors]
        gen = int(self.redis.incr(self.keys.gen_counter))
        steps = [int(survivors[m]) for m in alive]
        plan = {
            "generation": gen,
            "members": alive,
            "mode": ctx.opts.recovery,
            "plan_seq": int(self.redis.get(self.keys.plan_seq) or 0),
            "source": steps.index(max(steps)),
            "step": checkpoint.latest_step(ctx.opts.checkpoint_dir, ctx.opts.job_id),
        }
        if not self.redis.set(self.keys.recovery(failed), json.dumps(plan), nx=True):
            return  # a previous leader already decided this recovery
        for worker in dead:
            emit_event(self.redis, self.keys, "worker_failed", worker=worker, generation=failed)
        log(ctx.me, f"recovery of generation {failed}: survivors {alive}, dead {dead}")
        self.op = None
        self.pending = []
        self.published_seq = plan["plan_seq"]
        # wait for the survivors to come back, then report
        until = time.monotonic() + ctx.opts.sync_timeout_s + 30
        while self.redis.scard(self.keys.k("recovered", gen)) < len(alive):
            if time.monotonic() > until or not self._refresh_lease():
                break
            time.sleep(0.05)
        emit_event(
            self.redis,
            self.keys,
            "recovered",
            mode=plan["mode"],
            generation=gen,
            world=len(alive),
            dead=dead,
            step=ctx.step,
            restored_step=plan["step"] if plan["mode"] == "consistent" else max(steps),
        )
        if self.profile is not None:
            self.profile["start"] = ctx.step + WARMUP_STEPS
        self._set_state("running" if self.profile is None else "profiling")

    # -- metadata ---------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        self.redis.hset(self.keys.meta, "state", state)

    def _save_meta(self, generation: bool = True) -> None:
        mapping: dict[str, Any] = {
            "cursor": self.cursor,
            "queue": json.dumps(self.queue),
            "curve": json.dumps(self.curve),
            "profile": json.dumps(self.profile),
            "leader": self.ctx.me,
            "global_batch": self.ctx.opts.batch_size,
        }
        if generation:
            mapping["generation"] = self.ctx.generation
            mapping["members"] = json.dumps(self.ctx.members)
        self.redis.hset(self.keys.meta, mapping=mapping)
