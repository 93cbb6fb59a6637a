"""The process supervisor behind ``make run``: one command starts the whole portal.

    runstack
      ├── (embedded redis-server, when REDIS_URL is unset: owned by runstack, kept alive)
      ├── daphne            ASGI server: pages, REST API, WebSockets
      ├── celery worker     control-plane tasks (queue ``portal``)
      ├── celery worker     what-if simulations (queue ``whatif``), so they never starve the tick
      ├── celery beat       the periodic scheduler tick
      └── agents            one node agent per server of the demo cluster (when present)

A child that dies is started again, after a pause that doubles with each
quick death (1 s, 2 s, 4 s ... 30 s at most) and starts over once the child
has stayed up a minute::

    exit ─▶ failures += 1 ─▶ wait min(30, 1·2^(failures-1)) s ─▶ start ─▶ up 60 s ─▶ failures = 0

Every death and restart is logged; a dead child is no reason to stop the
rest.  Ctrl-C (SIGINT) or SIGTERM stops every child cleanly, then the
embedded Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

Keeper = Callable[[], str | None]
"""Something besides the children that the supervisor keeps alive (the embedded Redis):
called on every pass, it repairs what it looks after and says what it did, or returns None."""


@dataclass(frozen=True)
class ProcessSpec:
    """A child process of the stack."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting a child that keeps dying."""

    first_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 30.0
    healthy_after_s: float = 60.0
    """A child up this long counts as healthy: its next death starts the pauses over."""

    def delay(self, failures: int) -> float:
        """The pause before the restart that follows ``failures`` quick deaths in a row."""
        return float(min(self.cap_s, self.first_s * self.factor ** max(0, failures - 1)))


@dataclass
class Child:
    """One supervised child: its process now, and how often it died lately."""

    spec: ProcessSpec
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0


def python_module(module: str, *args: str) -> tuple[str, ...]:
    """argv that runs ``python -m module args`` with this interpreter."""
    return (sys.executable, "-m", module, *args)


class Stack:
    """Starts, watches, restarts and stops a set of child processes."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        *,
        log: Callable[[str], None],
        backoff: Backoff | None = None,
        keepers: Sequence[Keeper] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = {spec.name: Child(spec) for spec in specs}
        self.log = log
        self.backoff = backoff or Backoff()
        self.keepers = list(keepers)
        self.clock = clock
        self._stopping = False

    def start(self) -> None:
        """Start every child, in order."""
        for child in self.children.values():
            self._launch(child)

    def _launch(self, child: Child) -> None:
        env = {**os.environ, **child.spec.env}
        child.process = subprocess.Popen(child.spec.argv, env=env)
        child.started_at = self.clock()
        child.restart_at = None
        self.log(f"started {child.spec.name} (pid {child.process.pid})")

    def step(self) -> None:
        """One supervision pass: keep the keepers' services up, note deaths, restart when due."""
        for keeper in self.keepers:
            try:
                said = keeper()
            except Exception as exc:  # e.g. Redis could not start: say so, try again next pass
                said = f"could not restore a service: {exc}"
            if said:
                self.log(said)
        now = self.clock()
        for name, child in self.children.items():
            process = child.process
            if process is None:
                continue
            if child.restart_at is None:
                code = process.poll()
                if code is None:
                    continue
                if now - child.started_at >= self.backoff.healthy_after_s:
                    child.failures = 0
                child.failures += 1
                delay = self.backoff.delay(child.failures)
                child.restart_at = now + delay
                self.log(
                    f"{name} exited with status {code} after {now - child.started_at:.1f} s; "
                    f"restarting in {delay:g} s ({child.failures} quick exits in a row)"
                )
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                try:
                    self._launch(child)
                except OSError as exc:  # its program vanished, no memory...: later, more slowly
                    child.failures += 1
                    child.restart_at = now + self.backoff.delay(child.failures)
                    self.log(f"could not start {name}: {exc}; trying again later")

    def watch(self, poll_seconds: float = 0.5) -> int:
        """Supervise until a signal asks us to stop; then stop every child and return 0."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not self._stopping:
            self.step()
            time.sleep(poll_seconds)
        self.stop()
        return 0

    def stop(self, grace_seconds: float = 15.0) -> None:
        """SIGTERM every child (newest first), then SIGKILL what is left after the grace time."""
        running = [
            (name, child.process)
            for name, child in self.children.items()
            if child.process is not None
        ]
        for name, process in reversed(running):
            if process.poll() is None:
                self.log(f"stopping {name}")
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for name, process in running:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                self.log(f"{name} did not stop in time; killing it")
                process.kill()
                process.wait()
