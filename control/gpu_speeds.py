"""Each GPU type's speed as the admin set it (``GPU_TYPE_SPEEDS``: ``h100-80g:2``; a type not
named is the reference, 1.0), for the live snapshot's curves per type
(``control.assembly``: ``JobView.throughput_by_type``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from django.conf import settings

from scheduler.gpu_types import parse_type_numbers


def gpu_type_speeds() -> Mapping[str, float]:
    """The speed of each GPU type ``GPU_TYPE_SPEEDS`` names (empty: every type alike).

    A bad setting is a ValueError naming it (the tick stops with the reason rather than
    guess); a speed must be > 0.
    """
    return _parsed(str(getattr(settings, "GPU_TYPE_SPEEDS", "") or "").strip())


@lru_cache(maxsize=4)
def _parsed(text: str) -> Mapping[str, float]:
    """``text`` parsed once per value (every tick asks)."""
    if not text:
        return MappingProxyType({})
    speeds = parse_type_numbers(text, "GPU_TYPE_SPEEDS")
    for name, speed in speeds.items():
        if not speed > 0:
            raise ValueError(f"GPU_TYPE_SPEEDS {name}:{speed:g}: a speed must be > 0")
    return MappingProxyType(speeds)
