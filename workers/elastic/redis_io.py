"""Typed reads from Redis: redis-py's stubs cannot know that a client decodes responses.

The runtime's clients use ``decode_responses=True``; these helpers turn what
comes back into ``str`` (decoding bytes if a raw client is passed), so the
code above them is typed without casts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import redis
from redis.client import Pipeline

StreamEntries = list[tuple[str, dict[str, str]]]
"""``[(entry id, fields)]`` of a stream, oldest first."""


def text(value: Any) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def text_or_none(value: Any) -> str | None:
    """A Redis reply that may be nil, as text."""
    return None if value is None else text(value)


def read_stream(
    client: redis.Redis, key: str, after: str, count: int, block_ms: int | None = None
) -> StreamEntries:
    """Entries of stream ``key`` after id ``after`` (``block_ms``: wait that long for one)."""
    answer = cast(list[Any] | None, client.xread({key: after}, count=count, block=block_ms))
    out: StreamEntries = []
    for _stream, entries in answer or []:
        for entry_id, fields in entries:
            out.append((text(entry_id), {text(k): text(v) for k, v in fields.items()}))
    return out


def hash_fields(client: redis.Redis, key: str) -> dict[str, str]:
    """A hash as text."""
    raw = cast(dict[Any, Any], client.hgetall(key))
    return {text(k): text(v) for k, v in raw.items()}


def set_fields(client: redis.Redis, key: str, fields: Mapping[str, str | int | float]) -> None:
    """Write several fields of a hash."""
    # redis-py's stub wants a mapping keyed by every type it can encode; ours are str.
    client.hset(key, mapping=cast(Any, dict(fields)))


WRITE_IF_TRIES = 100
"""How often ``write_if`` starts again when another client changed the key under it."""


def write_if(
    client: redis.Redis,
    key: str,
    expected: str | bytes | None,
    write: Callable[[Pipeline], object],
) -> bool:
    """Queue ``write`` in a transaction if ``key`` holds ``expected`` (None: no such key).

    True if it ran; False if the key holds something else.  A compare-and-set
    without a script (a job's Redis user may not run any, ``redis_acl``): WATCH
    the key, read it, MULTI, ``write``, EXEC.  Another client's change between
    the read and EXEC voids the transaction and the check starts again; so does
    a connection lost while watching, after a plain GET on ``client`` has
    ridden out the outage (``redis_client.connect``).
    """
    for _ in range(WRITE_IF_TRIES):
        if client.get(key) != expected:  # outside the watch: the client's retries apply
            return False
        with client.pipeline() as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py's is untyped
                if pipe.get(key) != expected:
                    return False
                pipe.multi()
                write(pipe)
                pipe.execute()
                return True
            except redis.WatchError:
                continue
    raise redis.WatchError(f"{key} kept changing: gave up after {WRITE_IF_TRIES} tries")
