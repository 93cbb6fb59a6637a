"""The portal's end of a shell's two Redis streams (``workers.protocol.shell_keys``).

The consumer writes the client's input to ``agent:<node>:shell:<id>:in`` and reads the
shell's output from ``...:out``; an admin's close writes ``k`` to the input.  Every
write trims the stream (``SHELL_STREAM_MAXLEN``) and renews its expiry
(``SHELL_STREAM_TTL_S``), so an abandoned shell's keys go away by themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from workers.protocol import (
    SHELL_STREAM_MAXLEN,
    SHELL_STREAM_TTL_S,
    ShellEntry,
    shell_entries,
    shell_keys,
)

ALIVE_TTL_S = 30
"""A served shell's ``shells:alive:<id>`` key lives this long; its consumer renews it."""
ALIVE_EVERY_S = 10.0
COUNTS_EVERY_S = 2.0
"""How often at most a consumer writes new byte counts into the alive key (the admin page)."""


def alive_key(shell_id: str) -> str:
    """The key that says a portal process serves the shell (the portal's own key space)."""
    return f"shells:alive:{shell_id}"


def served(shell_ids: Iterable[str]) -> set[str]:
    """The shells of ``shell_ids`` that a consumer has renewed within ``ALIVE_TTL_S``."""
    ids = list(shell_ids)
    if not ids:
        return set()
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        found = client.mget([alive_key(i) for i in ids])
    finally:
        client.close()
    return {shell_id for shell_id, value in zip(ids, found, strict=True) if value is not None}


def parse_counts(value: bytes | str | None) -> tuple[int, int] | None:
    """``(bytes_in, bytes_out)`` from an alive key's value ``b"<in> <out>"``; None otherwise."""
    if value is None:
        return None
    parts = (value.encode() if isinstance(value, str) else value).split(b" ")
    if len(parts) != 2 or not all(part.isdigit() and len(part) <= 20 for part in parts):
        return None
    return int(parts[0]), int(parts[1])


def live_counts(shell_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """The bytes each served shell of ``shell_ids`` has moved so far, as its consumer last
    said (at most ``COUNTS_EVERY_S`` old); shells no process serves are left out."""
    ids = list(shell_ids)
    if not ids:
        return {}
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        found = client.mget([alive_key(i) for i in ids])
    finally:
        client.close()
    counts = {}
    for shell_id, value in zip(ids, found, strict=True):
        parsed = parse_counts(value)
        if parsed is not None:
            counts[shell_id] = parsed
    return counts


def input_key(node: str, shell_id: str) -> str:
    """The stream the shell reads from."""
    return shell_keys(node, shell_id)[0]


def output_key(node: str, shell_id: str) -> str:
    """The stream the shell writes to."""
    return shell_keys(node, shell_id)[1]


def send_close(node: str, shell_id: str) -> None:
    """Tell the agent to end the shell now (synchronous: an admin's API call)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        key = input_key(node, shell_id)
        client.xadd(key, {"k": "1"}, maxlen=SHELL_STREAM_MAXLEN, approximate=True)
        client.expire(key, SHELL_STREAM_TTL_S)
    finally:
        client.close()


class ShellStreams:
    """One consumer's asynchronous connection to one shell's streams."""

    def __init__(self, node: str, shell_id: str) -> None:
        self.in_key, self.out_key = shell_keys(node, shell_id)
        self.alive_key = alive_key(shell_id)
        self.client = aioredis.Redis.from_url(settings.REDIS_URL)
        self.last = "0-0"
        self.renewed_at = -ALIVE_EVERY_S
        self.counts = (-1, -1)

    async def renew(self, bytes_in: int = 0, bytes_out: int = 0) -> None:
        """Say that this process still serves the shell, and the bytes it has moved so far
        (every ``ALIVE_EVERY_S``; sooner, every ``COUNTS_EVERY_S``, while bytes flow)."""
        now = time.monotonic()
        since = now - self.renewed_at
        counts = (bytes_in, bytes_out)
        if since >= ALIVE_EVERY_S or (counts != self.counts and since >= COUNTS_EVERY_S):
            self.renewed_at, self.counts = now, counts
            await self.client.set(self.alive_key, f"{bytes_in} {bytes_out}", ex=ALIVE_TTL_S)

    async def send(self, fields: Mapping[str, bytes | str]) -> None:
        """One entry to the shell: ``d`` bytes, ``r`` a size, ``e`` end of input, ``k`` close."""
        entry: dict[Any, Any] = dict(fields)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(self.in_key, entry, maxlen=SHELL_STREAM_MAXLEN, approximate=True)
            pipe.expire(self.in_key, SHELL_STREAM_TTL_S)
            await pipe.execute()

    async def receive(self, block_ms: int) -> list[ShellEntry]:
        """The shell's next output entries (waiting up to ``block_ms``)."""
        answer = await self.client.xread({self.out_key: self.last}, count=100, block=block_ms)
        entries = shell_entries(answer)
        if entries:
            self.last = entries[-1][0]
        return entries

    async def close(self) -> None:
        """Forget the shell and drop the connection."""
        await self.client.delete(self.alive_key)
        await self.client.aclose()
