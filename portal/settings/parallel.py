"""Parallel test runs (``pytest -n``): what keeps one worker's services apart from another's."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def worker_redis_url(url: str, index: int) -> str:
    """``url`` with its database number moved up by ``index`` (pytest-xdist worker ``gw<index>``).

    Each worker of a parallel run gets a Redis database of its own, so one worker's tick
    lock, agent queues, caches and Celery queues are never another's.

    >>> worker_redis_url("redis://127.0.0.1:6379/0", 1)
    'redis://127.0.0.1:6379/1'
    >>> worker_redis_url("redis://h:6379", 2)
    'redis://h:6379/2'
    """
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db + index}"))
