"""The channel layer behind the live sockets, chosen by ``LIVE_CHANNEL_LAYER``.

Both are channels_redis layers on the one ``REDIS_URL``; they differ in what a
``group_send`` to a group of N sockets costs (docs/ui.md, *Fan-out*)::

    pubsub  group_send = 1 PUBLISH; every ASGI server subscribed to the group gets it
            once and hands it to its own sockets in memory: O(servers) Redis work
            per event, whatever the number of sockets.  At most once: a message
            published while a server's subscription is down is not kept (the page
            sees the seq gap and reloads its snapshot).
    core    group_send = N messages, one per socket's channel, each popped by the
            server's receive loop in its own round trip: O(sockets) per event.
            Kept in Redis for ``expiry`` seconds, at most ``capacity`` per channel.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

BACKENDS = {
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
    "core": "channels_redis.core.RedisChannelLayer",
}
DEFAULT_LAYER = "pubsub"


def channel_layers(kind: str, *, redis_url: str, socket_timeout_s: float) -> dict[str, Any]:
    """``CHANNEL_LAYERS`` for the layer named ``kind`` (one of :data:`BACKENDS`).

    ``socket_timeout_s``: redis-py 8 reads with a 5 s socket timeout by default, the
    same 5 s that the core layer blocks for in BZPOPMIN; on a busy machine the read
    timed out first and the socket's consumer died.  Reads may wait longer than that.
    """
    if kind not in BACKENDS:
        raise ImproperlyConfigured(
            f"LIVE_CHANNEL_LAYER must be one of {', '.join(sorted(BACKENDS))}, not {kind!r}"
        )
    config: dict[str, Any] = {
        "hosts": [{"address": redis_url, "socket_timeout": socket_timeout_s}],
    }
    if kind == "core":
        config.update(capacity=1000, expiry=30)
    return {"default": {"BACKEND": BACKENDS[kind], "CONFIG": config}}
