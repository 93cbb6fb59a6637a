"""Membership of one worker: its generation, its communicator, and how it gets the next one.

::

    Registration (thread, at start)          GroupBuilder
      generation 0: fill gen0members ──┐       build(plan)             blocking
      newcomer: rpc register → reply ──┴──▶    build_in_background()   while training goes on
                                               take(generation)        the built group, or ElasticError

``Membership`` is the current view (identical on every member after each
step); a switch or a recovery replaces it as a whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import torch

from workers.clock import Clock
from workers.elastic import comm, phases
from workers.elastic.constants import FINISHED, ElasticError, JobEnded, log
from workers.elastic.keys import JobKeys
from workers.elastic.messages import (
    PreparePlan,
    RecoveryPlan,
    Refused,
    Register,
    reply_from_json,
)
from workers.elastic.redis_io import hash_fields, text_or_none
from workers.elastic.store import RedisStore
from workers.elastic.transfer import StateTransfer


@dataclass
class Membership:
    """This worker's generation, its members (in rank order) and their process group."""

    me: str
    generation: int = -1
    members: list[str] = field(default_factory=list)
    group: Any = None

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation."""
        return self.members.index(self.me)

    @property
    def world(self) -> int:
        """Size of the current generation."""
        return len(self.members)

    def move_to(self, group: Any, generation: int, members: tuple[str, ...] | list[str]) -> None:
        """Adopt a new generation and its group."""
        self.group, self.generation, self.members = group, generation, list(members)


class GroupBuilder:
    """Builds the process groups of the generations this worker belongs to."""

    def __init__(
        self,
        store: RedisStore,
        me: str,
        device: torch.device,
        sync_timeout_s: float,
        backend: str | None = None,
    ) -> None:
        self.store = store
        self.me = me
        self.device = device
        self.sync_timeout_s = sync_timeout_s
        self.backend = backend
        self._building: dict[int, threading.Thread] = {}
        self._built: dict[int, Any] = {}
        self._errors: dict[int, BaseException] = {}
        self._started: set[int] = set()
        self._lock = threading.Lock()  # the main thread and the nudge watcher both start builds

    def build(self, plan: PreparePlan | RecoveryPlan) -> bool:
        """Build the group of ``plan`` (blocking); False if that failed."""
        gen = plan.generation
        rank = plan.members.index(self.me)
        try:
            group = comm.build_group(
                self.store,
                gen,
                rank,
                len(plan.members),
                self.device,
                self.sync_timeout_s,
                self.backend,
            )
            # Before this member says it is ready: the switch then pays for the state only.
            joiners = []
            if isinstance(plan, PreparePlan) and not plan.handoff:
                joiners = [plan.members.index(w) for w in plan.joiners]
            comm.warm_up(group, rank, plan.source, joiners, self.device)
        except Exception as exc:
            self._errors[gen] = exc
            return False
        self._built[gen] = group
        return True

    def build_in_background(self, plan: PreparePlan, on_built: Callable[[], None]) -> None:
        """Build the group of ``plan`` in a thread; call ``on_built`` once it is built."""
        gen = plan.generation
        with self._lock:
            if gen in self._started:  # once per generation, whoever asks first
                return
            self._started.add(gen)

            def run() -> None:
                if self.build(plan):
                    on_built()

            thread = threading.Thread(target=run, daemon=True, name=f"edl-build-{gen}")
            self._building[gen] = thread
            thread.start()

    def is_built(self, generation: int) -> bool:
        """Whether the group of ``generation`` is built and not taken yet."""
        return generation in self._built

    def take(self, generation: int, failure: str) -> Any:
        """The built group of ``generation`` (waiting for its build).

        Raises ElasticError ``"<failure>: <why the build failed>"`` if there is none.
        """
        thread = self._building.pop(generation, None)
        if thread is not None:
            thread.join()
        group = self._built.pop(generation, None)
        if group is None:
            raise ElasticError(f"{failure}: {self._errors.get(generation)}")
        return group


@dataclass(eq=False)
class MemberParts:
    """The context's parts a member changes generation with (``PlanFollower``, ``WorkerRecovery``)."""

    redis: redis.Redis
    keys: JobKeys
    view: Membership
    builder: GroupBuilder
    transfer: StateTransfer
    clock: Clock


@dataclass(frozen=True)
class Joined:
    """Where registration put this worker: the plan of its first generation."""

    plan: PreparePlan
    first_generation: bool


REGISTRATION_WAIT_S = 300.0
"""How long a newcomer waits for the leader's answer before it gives up."""


class Registration:
    """Finds this worker's first generation and builds its group, in a background thread."""

    def __init__(
        self,
        client: redis.Redis,
        keys: JobKeys,
        me: str,
        initial_world: int | None,
        sync_timeout_s: float,
        builder: GroupBuilder,
        clock: Clock,
        rank: int | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.me = me
        self.rank = rank
        self.initial_world = initial_world
        self.sync_timeout_s = sync_timeout_s
        self.builder = builder
        self.clock = clock
        self._result: Joined | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="edl-register")

    def start(self) -> None:
        """Register in the background."""
        self._thread.start()

    def wait(self) -> Joined:
        """The outcome of registration (blocking); ElasticError if it failed.

        JobEnded when the job ended before this worker could join (a scale-out
        decided just before the last step): the worker has nothing to do.
        """
        self._thread.join()
        if isinstance(self._error, JobEnded):
            raise self._error
        if self._error is not None:
            raise ElasticError(f"could not join: {self._error}")
        assert self._result is not None
        return self._result

    def _run(self) -> None:
        try:
            self._result = self._register()
        except BaseException as exc:  # surfaced to the main thread by wait()
            self._error = exc

    def _register(self) -> Joined:
        if self.rank is not None:  # before anything else: every later plan orders by it
            self.redis.hset(self.keys.ranks(), self.me, self.rank)
        n = self.initial_world
        if n is not None:
            # The counter tells the n first workers from a restarted one (a newcomer);
            # the first ones sit in generation 0 at their allocation rank (ranks.py).
            count = int(self.redis.incr(self.keys.k("gen0slot"))) - 1
            if count < n:
                rank = self.rank
                return self._first_generation(rank if rank is not None and rank < n else count, n)
        # a newcomer: register with the leader over the RPC list, wait for its answer
        while True:
            self.redis.rpush(self.keys.rpc, Register(worker=self.me).to_json())
            reply = self._await_reply()
            if reply is None:
                raise ElasticError("no leader answered the registration")
            answer = reply_from_json(reply[1])
            if isinstance(answer, Refused):
                raise ElasticError(f"registration refused: {answer.reason}")
            phases.mark("registered")
            self.builder.build(answer)
            if self.builder.is_built(answer.generation):
                phases.mark("communicator")
                return Joined(answer, first_generation=False)
            log(self.me, f"generation {answer.generation} failed to build; registering again")

    def _await_reply(self) -> Any:
        """The leader's answer to a registration (None: none in 300 s).

        Waits in one-second slices and gives up with JobEnded once the job has
        ended (its lease's tombstone, or the state its leader wrote last).
        """
        deadline = time.monotonic() + REGISTRATION_WAIT_S  # real time, as blpop's own timeout
        while time.monotonic() < deadline:
            reply = self.redis.blpop([self.keys.reply(self.me)], timeout=1)
            if reply is not None:
                return reply
            if self.job_ended():
                raise JobEnded("the job ended before this worker could join it")
        return None

    def job_ended(self) -> bool:
        """Whether the job has ended: its leader left the tombstone, or wrote ``finished``/``stopped``.

        A restarted job's first generation starts with a world size, never here.
        """
        if text_or_none(self.redis.get(self.keys.leader)) == FINISHED:
            return True
        return text_or_none(self.redis.hget(self.keys.meta, "state")) in ("finished", "stopped")

    def _first_generation(self, slot: int, n: int) -> Joined:
        self.redis.hset(self.keys.k("gen0members"), str(slot), self.me)
        deadline = self.clock.monotonic() + self.sync_timeout_s * 4
        while self.redis.hlen(self.keys.k("gen0members")) < n:
            if self.clock.monotonic() > deadline:
                raise ElasticError("generation 0 did not fill up")
            self.clock.sleep(0.02)
        by_slot = hash_fields(self.redis, self.keys.k("gen0members"))
        members = tuple(by_slot[str(i)] for i in range(n))
        plan = PreparePlan(generation=0, base_generation=-1, members=members, reason="gen0")
        self.builder.build(plan)
        return Joined(plan, first_generation=True)
