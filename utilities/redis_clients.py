"""One Redis client per URL for the whole process, shared by the code that talks to Redis often.

``redis.Redis.from_url`` makes a new client with its own connection pool, so
each call opens (and handshakes) a new connection.  The scheduler tick talks to
Redis several times a tick (its lock, its metrics, the forecast's due key); a
shared client keeps one pool and reuses its connections.  redis-py's pool is
safe across threads and notices a fork (a Celery prefork child starts with
fresh connections).
"""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def shared_redis() -> redis.Redis:
    """The process's client for ``REDIS_URL`` (a changed setting gets its own client)."""
    return _client(settings.REDIS_URL)
