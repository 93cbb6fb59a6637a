"""The leader lease and the liveness beat of one worker.

::

    edl:{job}:alive:{worker}   PX ALIVE_MS, refreshed every BEAT_S by every worker's beat thread
    edl:{job}:leader           worker id, SET NX PX LEASE_MS; refreshed by the leader
                               (compare-and-expire), handed on by compare-and-set

The beat thread takes a lapsed lease (the leader died) or notices one handed
to it (the leader left) and then calls ``on_lead``.

A Redis outage is no death: keys whose TTL ran out while Redis was away (or
that a restart dropped) mean nothing until this process has seen Redis answer
for a whole key lifetime since (``redis_client.OUTAGES``).  Until then a
lapsed lease is reclaimed by its holder only, and a missing liveness key does
not make a peer dead (``peer_is_dead``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from workers.clock import Clock
from workers.elastic.constants import ALIVE_MS, BEAT_S, FINISHED, LEASE_MS, log
from workers.elastic.keys import JobKeys
from workers.elastic.redis_client import OUTAGES, OutageLog
from workers.elastic.redis_io import write_if


class Lease:
    """The job's leader lease as seen by one worker."""

    def __init__(
        self,
        client: redis.Redis,
        keys: JobKeys,
        me: str,
        clock: Clock,
        outages: OutageLog = OUTAGES,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.me = me
        self.clock = clock
        self.outages = outages
        self._last_refresh = clock.monotonic()

    def holder(self) -> str | None:
        """Who holds the lease now (None: nobody)."""
        value = self.redis.get(self.keys.leader)
        return None if value is None else str(value)

    def is_mine(self) -> bool:
        """Whether this worker holds the lease."""
        return self.holder() == self.me

    def take(self) -> bool:
        """Take a free lease, or find it handed to us; True if it is ours now.

        Right after a Redis outage a free lease is left to its holder, who
        reclaims it on its next refresh: it lapsed for want of Redis, not of a leader.
        """
        if self.outages.settled(LEASE_MS / 1000 + BEAT_S):
            taken = self.redis.set(self.keys.leader, self.me, nx=True, px=LEASE_MS)
            if taken:
                return True
        return self.is_mine()

    def claim_first(self) -> None:
        """Generation 0's rank 0: clear a finished job's tombstone, then take the lease."""
        if self.holder() == FINISHED:  # restart of a stopped job
            self.redis.delete(self.keys.leader)
        self.redis.set(self.keys.leader, self.me, nx=True, px=LEASE_MS)

    def refresh(self) -> bool:
        """Extend the lease (every ``BEAT_S`` at most); False once another worker holds it."""
        now = self.clock.monotonic()
        if now - self._last_refresh > BEAT_S:
            if not self._extend(LEASE_MS) and not self._reclaim():
                return False
            self._last_refresh = now
        return True

    def hand_to(self, successor: str) -> None:
        """Pass the lease to ``successor`` (only if it is still ours)."""
        key = self.keys.leader
        write_if(self.redis, key, self.me, lambda tx: tx.set(key, successor, px=LEASE_MS))

    def release(self) -> None:
        """Let the lease lapse at once (only if it is still ours)."""
        self._extend(1)

    def _extend(self, ms: int) -> bool:
        """Set the lease's expiry to ``ms`` if it is ours; whether it was."""
        key = self.keys.leader
        return write_if(self.redis, key, self.me, lambda tx: tx.pexpire(key, ms))

    def _reclaim(self) -> bool:
        """Take the lease again if it lapsed (a Redis outage) and nobody took it."""
        key = self.keys.leader
        return write_if(self.redis, key, None, lambda tx: tx.set(key, self.me, px=LEASE_MS))

    def tombstone(self, ttl_ms: int = 30_000) -> None:
        """Mark the job ended, so that peers finishing a moment later do not take over."""
        self.redis.set(self.keys.leader, FINISHED, px=ttl_ms)


def peer_is_dead(
    client: redis.Redis, keys: JobKeys, worker: str, outages: OutageLog = OUTAGES
) -> bool:
    """Whether ``worker``'s liveness key lapsed while Redis was answering (a real death).

    False while Redis has not answered for a whole key lifetime since its last
    outage: the key may have expired with the outage, and the peer not yet
    have written it again.
    """
    if client.exists(keys.alive(worker)):
        return False
    return outages.settled(ALIVE_MS / 1000 + BEAT_S)


def first_dead_peer(client: redis.Redis, keys: JobKeys, members: list[str], me: str) -> str | None:
    """The first of ``members`` (not ``me``) whose liveness key lapsed; None if all live.

    One ``EXISTS`` for all while everyone lives; ``peer_is_dead`` per member
    only then. A Redis error answers None: an outage is not a death.
    """
    peers = [m for m in members if m != me]
    try:
        if not peers or client.exists(*(keys.alive(m) for m in peers)) == len(peers):
            return None
        return next((m for m in peers if peer_is_dead(client, keys, m)), None)
    except redis.RedisError:
        return None


class Beat:
    """A daemon thread that keeps this worker's liveness key fresh and watches the lease."""

    def __init__(
        self,
        lease: Lease,
        eligible: Callable[[], bool],
        on_lead: Callable[[], None],
        clock: Clock,
    ) -> None:
        self.lease = lease
        self._eligible = eligible
        self._on_lead = on_lead
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="edl-beat")

    def start(self) -> None:
        """Start beating."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (the liveness key then lapses unless deleted)."""
        self._stop.set()

    def beat_once(self) -> None:
        """Refresh the liveness key; lead if eligible and the lease is (or became) ours."""
        lease = self.lease
        lease.redis.set(lease.keys.alive(lease.me), "1", px=ALIVE_MS)
        if self._eligible() and lease.take():
            # a lapsed lease (leader died) or one handed to us (leader left)
            self._on_lead()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat_once()
            except redis.RedisError as exc:
                log(self.lease.me, f"redis unavailable: {exc}")
            self._stop.wait(BEAT_S)
