"""The one place the runtime (and the agent) build Redis clients: clients that ride out an outage.

A Redis restart is not a fault of the job::

    command ──▶ ConnectionError / TimeoutError / BusyLoadingError (loading its AOF)
       ▲            │
       │            ▼
       └── sleep 10 ms, 20 ms, ... capped at BACKOFF_CAP_S ── until outage_s has passed,
                                                             then the error is raised

Every client comes with a redis-py ``Retry`` whose backoff also notes *when*
Redis last failed in this process (``OUTAGES``).  Liveness judgements read it:
a peer's liveness key that lapsed while Redis was away (or that a restart
dropped, its TTL run out) is no sign of death until the peers have had
``ALIVE_MS`` of reachable Redis to write it again (``OutageLog.settled``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

T = TypeVar("T")

DEFAULT_OUTAGE_S = 60.0
"""How long a Redis outage the runtime rides out by default (``--redis-outage-s``)."""

MAX_OUTAGE_S = 3600.0
"""The longest outage a worker may be told to wait for (a bound on hostile options)."""

CONTROL_OUTAGE_S = 10.0
"""The outage ridden out by ``JobControl`` (the control plane's calls must not hang a tick)."""

BACKOFF_BASE_S = 0.01
"""The first pause after a failed command (doubled each time up to the cap)."""

BACKOFF_CAP_S = 0.5
"""The longest pause between two tries: a restarted Redis is used again within it."""

RETRIED_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,  # a subclass of ConnectionError, named for the reader
    TimeoutError,  # socket.timeout
    ConnectionError,  # the builtin: a reset socket below redis-py
)
"""The errors that mean "Redis is away", not "the command is wrong"."""

NOT_AN_OUTAGE: tuple[type[Exception], ...] = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
)
"""Subclasses of ConnectionError that a wait does not cure (a wrong password): raised at once."""


class OutageLog:
    """When this process last found Redis unreachable (monotonic seconds; shared by all clients)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_failure: float | None = None

    def note_failure(self, now: float | None = None) -> None:
        """Record that a Redis command just failed for want of Redis."""
        with self._lock:
            self._last_failure = time.monotonic() if now is None else now

    def last_failure(self) -> float | None:
        """The monotonic time of the latest failure, None if Redis never failed here."""
        with self._lock:
            return self._last_failure

    def settled(self, quiet_s: float, now: float | None = None) -> bool:
        """Whether Redis has answered for ``quiet_s`` since it last failed (or never failed).

        A liveness key missing while this is False may have been lost with the
        outage: the peer may not have had the time to write it again.
        """
        last = self.last_failure()
        current = time.monotonic() if now is None else now
        return last is None or current - last >= quiet_s

    def __deepcopy__(self, memo: dict[int, Any]) -> OutageLog:
        # redis-py deep-copies a client's Retry into each connection: all copies
        # must report to the one log of the process.
        return self


OUTAGES = OutageLog()
"""The process's record of Redis outages."""


def pause_after(failures: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """The pause after the ``failures``-th failure in a row: doubled each time, capped.

    The exponent is bounded: redis-py's own ``base * 2**failures`` overflows a
    float after about a thousand failures, which a long outage reaches.
    """
    return min(cap, base * 2.0 ** min(failures, 64))


class NotingBackoff(ExponentialBackoff):
    """Exponential backoff that records each failure in an ``OutageLog``."""

    def __init__(self, outages: OutageLog, cap: float, base: float) -> None:
        super().__init__(cap=cap, base=base)
        self.outages = outages

    def compute(self, failures: int) -> float:
        """The pause before try ``failures + 1`` (called once per failure)."""
        self.outages.note_failure()
        return pause_after(failures, self._base, self._cap)


def retries_for(outage_s: float, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> int:
    """How many retries make the backoff pauses add up to at least ``outage_s``."""
    if not outage_s >= 0 or math.isinf(outage_s):  # also refuses nan
        raise ValueError(f"outage_s must be a finite number >= 0, not {outage_s!r}")
    total = 0.0
    failures = 0
    while total < outage_s:
        failures += 1
        total += pause_after(failures, base, cap)
    return failures


class CredentialsSeen:
    """Whether a client's credentials have worked once (shared by its connections)."""

    def __init__(self) -> None:
        self.accepted = False

    def __deepcopy__(self, memo: dict[int, Any]) -> CredentialsSeen:
        # as OutageLog: every connection's copy of the Retry shares the client's record
        return self


class OutageRetry(Retry):
    """redis-py's ``Retry``, except that refused credentials are raised at once, not waited on.

    Once the credentials have worked, a refusal is an outage too: a restarted
    server comes back without the ACL users made at run time (a job's Redis
    user, ``workers.agent.redis_acl``), and its agent makes that user again
    within a heartbeat.  Only a client whose credentials never worked fails
    at once (a wrong password).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.credentials = CredentialsSeen()

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """Call ``do``, retrying it through an outage (see ``Retry.call_with_retry``)."""

        def retryable(error: Exception) -> bool:
            if isinstance(error, NOT_AN_OUTAGE) and not self.credentials.accepted:
                return False
            return is_retryable is None or is_retryable(error)

        result = super().call_with_retry(do, fail, retryable, with_failure_count)
        self.credentials.accepted = True
        return result


def outage_retry(outage_s: float = DEFAULT_OUTAGE_S, outages: OutageLog = OUTAGES) -> Retry:
    """A redis-py ``Retry`` that keeps trying for ``outage_s`` on the errors of a Redis outage."""
    backoff = NotingBackoff(outages, cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S)
    return OutageRetry(backoff, retries_for(outage_s), supported_errors=RETRIED_ERRORS)


def connect(
    url: str,
    *,
    outage_s: float = DEFAULT_OUTAGE_S,
    decode_responses: bool = True,
    outages: OutageLog = OUTAGES,
) -> redis.Redis:
    """A client on ``url`` whose commands survive a Redis outage of up to ``outage_s``."""
    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        retry=outage_retry(outage_s, outages),
        retry_on_error=list(RETRIED_ERRORS),
        health_check_interval=0,
    )
