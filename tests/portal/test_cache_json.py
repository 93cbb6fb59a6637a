"""The cache stores JSON: a pickle planted in Redis is a miss, never code run in the portal."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from portal import whatif
from portal.cache import JSONSerializer


class Planted:
    """Unpickling this runs ``exec``: what an attacker with write access to Redis would plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_a_planted_pickle_is_a_miss_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Planted(marker))
    key = "whatif:planted"
    raw = redis.Redis.from_url(str(settings.REDIS_URL))
    raw.set(cache.make_key(key), payload, ex=60)
    try:
        assert whatif.get_run("planted") is None
        assert cache.get(key) is None
    finally:
        raw.delete(cache.make_key(key))
    assert not marker.exists()
    # The way Django's own serializer would have read it: this is what the JSON one prevents.
    pickle.loads(payload)
    assert marker.read_text() == "pwned"


def test_values_round_trip_as_json_and_counters_stay_atomic() -> None:
    state = {"status": "done", "progress": 1.0, "report": {"jobs": 3, "cdf": [1.5, 2]}}
    cache.set("json:state", state, 30)
    assert cache.get("json:state") == state
    cache.set("json:count", 1, 30)
    assert cache.incr("json:count") == 2 and cache.get("json:count") == 2
    raw = redis.Redis.from_url(str(settings.REDIS_URL))
    assert raw.get(cache.make_key("json:state")).startswith(b'{"status":"done"')
    cache.delete_many(["json:state", "json:count"])


def test_the_serializer_refuses_what_json_cannot_say() -> None:
    serializer = JSONSerializer()
    assert serializer.loads(serializer.dumps((1, "a"))) == [1, "a"]
    assert serializer.loads(b"\x80\x04K\x01.") is None  # a pickle of 1
    with pytest.raises(TypeError):
        serializer.dumps(object())
