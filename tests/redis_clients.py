"""Redis clients for tests that expect to be refused."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def one_try(**kwargs: Any) -> redis.Redis:
    """A client that connects once: a refused AUTH is the answer the test wants.

    redis-py 8 retries a failed connect, refusals included, with backoff: each
    refused client would cost the test seconds of waiting for nothing.
    """
    return redis.Redis(retry=Retry(NoBackoff(), 0), **kwargs)
