"""A ``torch.distributed.Store`` kept in Redis, so process groups need no extra port.

Every generation of a job builds its process group on
``PrefixStore(f"gen{g}", RedisStore(...))``; the keys live under
``edl:{job}:store:`` and survive the death of any worker (a ``TCPStore`` would
die with the process that hosts it, the leader included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import cast

import torch.distributed as dist

# torch.distributed re-exports these from here; its stub does not say so.
from torch._C._distributed_c10d import Store

from workers.elastic.redis_client import DEFAULT_OUTAGE_S, connect
from workers.elastic.redis_io import write_if

ABANDON_CHECK_S = 1.0
"""How often a wait asks its ``abandoned`` callback whether to give up."""


class RedisStore(Store):
    """The subset of the c10d store protocol that gloo and NCCL rendezvous use.

    ``abandoned``: asked about once a second while a wait blocks; a reason
    (not None) ends the wait at once with ``DistStoreError``. A newcomer's
    store says why when its job has ended: the rendezvous of a generation its
    finished leader prepared would otherwise wait the whole timeout for
    every key the leader deleted, one after the other (2026-12-04 12:01: four
    newcomers held their slots for over three minutes).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        outage_s: float = DEFAULT_OUTAGE_S,
        timeout: timedelta = timedelta(seconds=60),
        abandoned: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__()
        self._url = url
        self._outage_s = outage_s
        self._client = connect(url, outage_s=outage_s, decode_responses=False)
        self._prefix = prefix
        self._timeout = timeout
        self._abandoned = abandoned

    def clone(self) -> RedisStore:
        """Another handle on the same keys (the state lives in Redis, not in this object)."""
        return RedisStore(self._url, self._prefix, self._outage_s, self._timeout, self._abandoned)

    def _k(self, key: str) -> str:
        return self._prefix + key

    def set(self, key: str, value: bytes | str) -> None:
        self._client.set(self._k(key), value)

    def get(self, key: str) -> bytes:
        self.wait([key])
        value = self._client.get(self._k(key))
        assert value is not None
        return value if isinstance(value, bytes) else value.encode()

    def add(self, key: str, value: int) -> int:
        return int(self._client.incrby(self._k(key), value))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """c10d's compare-and-set: ``desired`` if set, else the current value (``expected``
        if there is none); an empty ``expected`` matches a missing key.

        A transaction, not a script: a job's Redis user may not run scripts.
        """
        name, want, new = self._k(key), _as_bytes(expected), _as_bytes(desired)
        while True:
            current = cast(bytes | None, self._client.get(name))
            if current is None and want:
                return want
            if current is not None and current != want:
                return current
            if write_if(self._client, name, current, lambda tx: tx.set(name, new)):
                return new

    def check(self, keys: list[str]) -> bool:
        return bool(self._client.exists(*[self._k(k) for k in keys]) == len(keys))

    def delete_key(self, key: str) -> bool:
        return bool(self._client.delete(self._k(key)))

    def num_keys(self) -> int:
        return sum(1 for _ in self._client.scan_iter(match=self._prefix + "*", count=500))

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self._timeout).total_seconds()
        now = time.monotonic()
        deadline, ask_at = now + limit, now + ABANDON_CHECK_S
        pause = 0.001
        while not self.check(keys):
            now = time.monotonic()
            if now > deadline:
                raise dist.DistStoreError(f"timed out after {limit:.0f}s waiting for {keys}")
            if self._abandoned is not None and now >= ask_at:
                ask_at = now + ABANDON_CHECK_S
                reason = self._abandoned()
                if reason is not None:
                    raise dist.DistStoreError(f"gave up waiting for {keys}: {reason}")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
