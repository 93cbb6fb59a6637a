"""Time, injected: the real clock in production, a manual one in tests.

Every piece of ``workers/`` with timing logic (the agent's heartbeats and stop
deadlines, the leader's lease and progress cadence, the straggler detector's
callers, the runtime's checkpoint timer) takes a ``Clock`` instead of calling
``time.*`` itself, so that a test advances time by hand instead of sleeping
and hoping.

``now()`` is wall time (Unix seconds: timestamps that leave the process);
``monotonic()`` measures intervals; ``sleep()`` waits.  ``ManualClock`` moves
only when told to: ``sleep(s)`` advances it by ``s`` at once, so a loop that
polls with a deadline terminates in a test without real waiting.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What timing logic reads: wall time, a monotonic time, and a way to wait."""

    def now(self) -> float:
        """Wall-clock time in seconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


class SystemClock:
    """The real clock (``time.time``, ``time.monotonic``, ``time.sleep``)."""

    def now(self) -> float:
        """Wall-clock time in seconds since the Unix epoch."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``."""
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
"""The one real clock; the default wherever a clock is injected."""


class ManualClock:
    """A clock for tests: it stands still until ``advance`` (or ``sleep``) moves it."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._t = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The manual time (it serves as wall and monotonic time alike)."""
        with self._lock:
            return self._t

    def monotonic(self) -> float:
        """The manual time."""
        return self.now()

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` at once: a polling loop ends without real waiting."""
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._t += seconds
