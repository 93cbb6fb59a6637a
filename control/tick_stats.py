"""Tick durations kept in Redis, so that every process's ticks add up to one metric.

The tick records (:func:`queue_tick_stats`, sent with its lock's release); ``/metrics``
(``portal.metrics``) reads.
"""

from __future__ import annotations

import redis
from django.conf import settings
from redis.client import Pipeline

TICK_STATS_KEY = "portal:metrics:tick"


def queue_tick_stats(pipe: Pipeline, duration_s: float) -> None:
    """Remember one tick's duration (count, sum, last) for the metrics endpoint: the commands,
    queued on the caller's pipeline (the tick sends them with its lock's release, in one
    round trip); their errors are the caller's to ignore (metrics never break a tick)."""
    pipe.hincrby(TICK_STATS_KEY, "count", 1)
    pipe.hincrbyfloat(TICK_STATS_KEY, "sum", duration_s)
    pipe.hset(TICK_STATS_KEY, "last", duration_s)


def read_tick_stats() -> dict[str, float]:
    """Count, sum and last duration of the ticks so far (empty when Redis is unreachable)."""
    try:
        raw = redis.Redis.from_url(settings.REDIS_URL).hgetall(TICK_STATS_KEY)
    except redis.RedisError:
        return {}
    return {_text(k): float(v) for k, v in raw.items()}


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key
