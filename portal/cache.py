"""A JSON serializer for Django's Redis cache: what a Redis writer plants is data, never code.

Django's ``RedisCache`` pickles values by default, and unpickling runs code:
anyone able to write one key of the portal's Redis could run code in the web
process the next time the key was read.  This serializer stores JSON only.
Integers stay bare (Redis ``INCR`` works on them, as with Django's own
serializer); a value that does not decode as JSON (a planted pickle, a
truncated write) is logged and read as a miss (``None``).  Values must be
JSON data: a tuple comes back as a list, and anything else (a datetime, a
model instance) fails loudly when it is stored.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


class JSONSerializer:
    """``dumps``/``loads`` for ``django.core.cache.backends.redis.RedisCache`` (``OPTIONS``)."""

    def dumps(self, obj: Any) -> bytes | int:
        """JSON bytes for a value; a bare int for an int (so that ``incr`` stays atomic)."""
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    def loads(self, data: bytes | int) -> Any:
        """The JSON value stored, or None (a miss) for bytes that are not JSON."""
        if isinstance(data, int):
            return data
        try:
            return json.loads(data)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
            log.warning(
                "cache: a value that is not JSON was read and ignored (%d bytes)", len(data)
            )
            return None
