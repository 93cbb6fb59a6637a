"""The watch a worker runs while blocked in the all-reduce: which peer's liveness key lapsed.

Against a real Redis (and one of the test's own, stopped, for the outage case).
"""

from __future__ import annotations

import uuid

from workers.elastic.constants import ALIVE_MS
from workers.elastic.keys import JobKeys
from workers.elastic.lease import first_dead_peer
from workers.elastic.redis_client import OutageLog, connect
from workers.tests.redis_server import OwnRedis


def test_the_first_peer_without_a_key_is_named_never_oneself(redis_url: str) -> None:
    client = connect(redis_url, outage_s=1.0, outages=OutageLog())
    keys = JobKeys(f"t{uuid.uuid4().hex[:8]}")
    members = ["w0", "w1", "w2"]
    for worker in members:
        client.set(keys.alive(worker), "1", px=ALIVE_MS)
    assert first_dead_peer(client, keys, members, "w0") is None
    client.delete(keys.alive("w0"))
    assert first_dead_peer(client, keys, members, "w0") is None  # my own key is not a peer's
    client.delete(keys.alive("w2"))
    assert first_dead_peer(client, keys, members, "w0") == "w2"
    assert first_dead_peer(client, keys, ["w0"], "w0") is None  # alone: nobody to lose
    client.delete(*(keys.alive(w) for w in members))


def test_an_unreachable_redis_is_no_death(own_redis: OwnRedis) -> None:
    """While Redis is down the watch says nothing: the outage is not the peers' death."""
    client = connect(own_redis.url(0), outage_s=0.5, outages=OutageLog())
    keys = JobKeys(f"t{uuid.uuid4().hex[:8]}")
    own_redis.stop()
    assert first_dead_peer(client, keys, ["w0", "w1"], "w0") is None
