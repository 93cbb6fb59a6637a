"""Tick durations kept in Redis, so that every process's ticks add up to one metric.

The tick records; ``/metrics`` (``portal.metrics``) reads.
"""

from __future__ import annotations

import redis
from django.conf import settings

from utilities.redis_clients import shared_redis

TICK_STATS_KEY = "portal:metrics:tick"


def record_tick(duration_s: float) -> None:
    """Remember one tick's duration (count, sum, last) for the metrics endpoint."""
    try:
        pipe = shared_redis().pipeline()
        pipe.hincrby(TICK_STATS_KEY, "count", 1)
        pipe.hincrbyfloat(TICK_STATS_KEY, "sum", duration_s)
        pipe.hset(TICK_STATS_KEY, "last", duration_s)
        pipe.execute()
    except redis.RedisError:
        pass  # metrics must never break a tick


def read_tick_stats() -> dict[str, float]:
    """Count, sum and last duration of the ticks so far (empty when Redis is unreachable)."""
    try:
        raw = redis.Redis.from_url(settings.REDIS_URL).hgetall(TICK_STATS_KEY)
    except redis.RedisError:
        return {}
    return {_text(k): float(v) for k, v in raw.items()}


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key
