"""Typed reads from Redis: redis-py's stubs cannot know that a client decodes responses.

The runtime's clients use ``decode_responses=True``; these helpers turn what
comes back into ``str`` (decoding bytes if a raw client is passed), so the
code above them is typed without casts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import redis

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
