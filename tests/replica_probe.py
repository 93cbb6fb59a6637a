"""A Celery worker of the portal whose scheduler ticks leave a trace (tests/test_replicas.py).

    python -m tests.replica_probe <celery worker arguments>

Runs ``celery -A portal <arguments>`` unchanged, except that two functions of the
real tick are wrapped before the worker forks its pool:

    control.tick._tick   the body that runs under both tick locks: its
                              [start, end] is pushed to the Redis list TICKS_KEY
    control.tasks.run_tick       every attempt, and whether it ran or found the
                              lock taken, pushed to ATTEMPTS_KEY

Each record names the replica (``REPLICA_NAME``) and the process. Nothing else
changes: the wrapped functions run as they are, on the real database and Redis.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

TICKS_KEY = "replicas:ticks"
ATTEMPTS_KEY = "replicas:attempts"


def _push(key: str, record: dict[str, Any]) -> None:
    import redis
    from django.conf import settings

    record.update(replica=os.environ.get("REPLICA_NAME", "?"), pid=os.getpid())
    redis.Redis.from_url(settings.REDIS_URL).rpush(key, json.dumps(record))


def _traced_body(body: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(body)
    def traced(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return body(*args, **kwargs)
        finally:
            _push(TICKS_KEY, {"start": start, "end": time.time()})

    return traced


def _traced_attempt(run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run)
    def traced(*args: Any, **kwargs: Any) -> Any:
        result = run(*args, **kwargs)
        _push(ATTEMPTS_KEY, {"ran": bool(result.ran), "at": time.time()})
        return result

    return traced


def install() -> None:
    """Wrap the tick's locked body and its entry point in this process (and its forks)."""
    import django

    django.setup()
    import control.tasks as tasks
    import control.tick as tick

    # Named explicitly: if the tick's structure changes, this fails loudly instead of
    # silently tracing nothing.
    tick._tick = _traced_body(tick._tick)
    tasks.run_tick = _traced_attempt(tasks.run_tick)


def main() -> None:
    """Install the traces, then hand the command line to Celery."""
    install()
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", "-A", "portal", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
