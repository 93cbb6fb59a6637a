"""Throughput profiling, run by the leader: samples/s at each size from ``max`` down to ``min``.

::

    begin ── world > max? scale in the extra workers first
    each level: 2 warm-up mini-batches, then ``batches`` measured ── curve[world] = samples/s
        world > min: scale in one worker (never the leader), next level
        world = min: publish ``profile_done`` with the curve, back to running
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import redis

from workers.elastic.constants import log
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.elastic.leader_meta import LeaderMeta
from workers.elastic.messages import ProfileRequest, ProfileState
from workers.elastic.views import ProfiledJob
from workers.runtime_events import ProfileDoneEvent

WARMUP_STEPS = 2


class ProfileHost(Protocol):
    """What the profiler uses of its leader."""

    @property
    def view(self) -> ProfiledJob: ...
    @property
    def meta(self) -> LeaderMeta: ...
    @property
    def redis(self) -> redis.Redis: ...
    @property
    def keys(self) -> JobKeys: ...
    def prepare(self, leavers: list[str], joiners: list[str], reason: str) -> None: ...
    def set_state(self, state: str) -> None: ...
    def save_meta(self, generation: bool = True) -> None: ...


class Profiler:
    """The profile in progress of one leader (its state lives in the leader's metadata)."""

    def __init__(self, leader: ProfileHost) -> None:
        self.leader = leader
        self.meta = leader.meta

    @property
    def state(self) -> ProfileState | None:
        """The profile in progress, if any."""
        return self.meta.profile

    @property
    def active(self) -> bool:
        """Whether a profile is in progress."""
        return self.meta.profile is not None

    def begin(self, request: ProfileRequest) -> None:
        """Start a profile (scaling in to ``max`` first if the job is bigger)."""
        view = self.leader.view
        self.meta.profile = ProfileState(min=request.min, max=request.max, batches=request.batches)
        self.meta.curve = {}
        if view.world > request.max:
            extra = [w for w in reversed(view.members) if w != view.me][: view.world - request.max]
            self.leader.prepare(extra, [], "profile")
        else:
            self.restart_level()
        self.leader.set_state("profiling")

    def restart_level(self) -> None:
        """Measure the current size from the next mini-batches on (after a warm-up)."""
        if self.meta.profile is not None:
            start = self.leader.view.step + WARMUP_STEPS
            self.meta.profile = replace(self.meta.profile, start=start)

    def tick(self) -> None:
        """Record the current level once measured; move to the next or finish."""
        leader, view, prof = self.leader, self.leader.view, self.meta.profile
        assert prof is not None
        start = prof.start
        if start is None or view.step < start + prof.batches:
            return
        batches, seconds = view.throughput_since(start)
        if batches <= 0 or seconds <= 0:
            return
        rate = view.opts.batch_size * batches / seconds
        self.meta.curve[str(view.world)] = rate
        log(view.me, f"profile: {view.world} workers -> {rate:.1f} samples/s")
        if view.world > prof.min:
            leaver = next(w for w in reversed(view.members) if w != view.me)
            self.meta.profile = replace(prof, start=None)
            leader.prepare([leaver], [], "profile")
        else:
            curve = dict(self.meta.curve)
            self.meta.profile = None
            leader.save_meta()
            leader.set_state("running")
            publish(leader.redis, leader.keys, ProfileDoneEvent(curve=curve))
        leader.save_meta()
