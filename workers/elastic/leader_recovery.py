"""The leader's side of failure recovery (a worker's side is in ``recovery.py``).

::

    survivors:{g} appeared ─▶ wait until every member of g reported or lost its alive key
        ─▶ recovery:{g} = RecoveryPlan  (SET NX: a leader that lost the race adopts the winner's)
        ─▶ worker_failed per dead member ─▶ wait for recovered:{g'} ─▶ recovered event
"""

from __future__ import annotations

from typing import Protocol

import redis

from workers.clock import Clock
from workers.elastic.checkpoint import Checkpoints, Manifest, Skipped
from workers.elastic.constants import ALIVE_MS, log
from workers.elastic.control import publish
from workers.elastic.keys import JobKeys
from workers.elastic.lease import peer_is_dead
from workers.elastic.messages import RecoveryPlan
from workers.elastic.ranks import order_by_rank, parse_ranks
from workers.elastic.redis_io import hash_fields
from workers.elastic.transfer import report_skipped
from workers.elastic.views import WorkerView
from workers.runtime_events import RecoveredEvent, WorkerFailedEvent
from workers.store_door import open_store


class RecoveryHost(Protocol):
    """What recovery uses of its leader."""

    @property
    def view(self) -> WorkerView: ...
    @property
    def redis(self) -> redis.Redis: ...
    @property
    def keys(self) -> JobKeys: ...
    @property
    def clock(self) -> Clock: ...
    def refresh_lease(self) -> bool: ...
    def set_state(self, state: str) -> None: ...
    def after_recovery(self, plan_seq: int) -> None: ...
    def resume_after_recovery(self) -> None: ...


def coordinate_recovery(leader: RecoveryHost) -> None:
    """Some member saw generation g fail: wait for every member to report or expire, then plan."""
    view, client, keys, clock = leader.view, leader.redis, leader.keys, leader.clock
    failed = view.generation
    members = list(view.members)
    leader.set_state("recovering")
    deadline = clock.monotonic() + view.opts.sync_timeout_s + 2 * ALIVE_MS / 1000 + 5
    while True:
        survivors = hash_fields(client, keys.survivors(failed))
        dead = [m for m in members if m not in survivors and peer_is_dead(client, keys, m)]
        if len(survivors) + len(dead) >= len(members) or clock.monotonic() > deadline:
            break
        if not leader.refresh_lease():
            return
        clock.sleep(0.05)
    # the survivors in the latest plan's rank order, like every generation (ranks.py)
    ranks = parse_ranks(hash_fields(client, keys.ranks()))
    alive = list(order_by_rank([m for m in members if m in survivors], ranks))
    dead = [m for m in members if m not in survivors]
    gen = int(client.incr(keys.gen_counter))
    steps = [int(survivors[m]) for m in alive]
    latest: Manifest | None = None
    skipped: list[Skipped] = []
    if view.opts.recovery == "consistent":  # the newest checkpoint that verifies, wherever written
        checkpoints = Checkpoints(open_store(view.opts.store_url), view.opts.checkpoint_keep)
        latest, skipped = checkpoints.latest()
    plan = RecoveryPlan(
        generation=gen,
        members=tuple(alive),
        mode=view.opts.recovery,  # type: ignore[arg-type]  # checked by the CLI
        plan_seq=int(client.get(keys.plan_seq) or 0),
        source=steps.index(max(steps)),
        step=None if latest is None else latest.step,
    )
    if not client.set(keys.recovery(failed), plan.to_json(), nx=True):
        return  # a previous leader already decided this recovery
    report_skipped(client, keys, skipped)
    for worker in dead:
        publish(client, keys, WorkerFailedEvent(worker=worker, generation=failed))
    log(view.me, f"recovery of generation {failed}: survivors {alive}, dead {dead}")
    leader.after_recovery(plan.plan_seq)
    # wait for the survivors to come back, then report
    until = clock.monotonic() + view.opts.sync_timeout_s + 30
    while client.scard(keys.k("recovered", gen)) < len(alive):
        if clock.monotonic() > until or not leader.refresh_lease():
            break
        clock.sleep(0.05)
    event = RecoveredEvent(
        mode=plan.mode,
        generation=gen,
        world=len(alive),
        dead=tuple(dead),
        step=view.step,
        restored_step=plan.step if plan.mode == "consistent" else max(steps),
    )
    publish(client, keys, event)
    leader.resume_after_recovery()
