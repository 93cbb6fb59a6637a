"""The process supervisor behind ``make run``: one command starts the whole portal.

    runstack
      ├── (embedded redis-server, when REDIS_URL is unset: started by the settings)
      ├── daphne            ASGI server: pages, REST API, WebSockets
      ├── celery worker     control-plane tasks (queue ``portal``)
      ├── celery beat       the periodic scheduler tick
      └── agents            one node agent per server of the demo cluster (when present)

Ctrl-C (SIGINT) or SIGTERM stops every child cleanly, then the embedded Redis.
If a child dies on its own the whole stack stops with a message, rather than
limping on half-started.
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


@dataclass(frozen=True)
class ProcessSpec:
    """A child process of the stack."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def python_module(module: str, *args: str) -> tuple[str, ...]:
    """argv that runs ``python -m module args`` with this interpreter."""
    return (sys.executable, "-m", module, *args)


class Stack:
    """Starts, watches and stops a set of child processes."""

    def __init__(self, specs: Sequence[ProcessSpec], *, log: Callable[[str], None]) -> None:
        self.specs = list(specs)
        self.log = log
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def start(self) -> None:
        """Start every child, in order."""
        for spec in self.specs:
            env = {**os.environ, **spec.env}
            self.children[spec.name] = subprocess.Popen(spec.argv, env=env)
            self.log(f"started {spec.name} (pid {self.children[spec.name].pid})")

    def watch(self, poll_seconds: float = 0.5) -> int:
        """Block until a signal asks us to stop or a child dies; return an exit status."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        status = 0
        while not self._stopping:
            for name, child in self.children.items():
                code = child.poll()
                if code is not None:
                    self.log(f"{name} exited with status {code}; stopping the stack")
                    status = code or 1
                    self._stopping = True
                    break
            time.sleep(poll_seconds)
        self.stop()
        return status

    def stop(self, grace_seconds: float = 15.0) -> None:
        """SIGTERM every child (newest first), then SIGKILL what is left after the grace time."""
        for name, child in reversed(list(self.children.items())):
            if child.poll() is None:
                self.log(f"stopping {name}")
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for name, child in self.children.items():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                self.log(f"{name} did not stop in time; killing it")
                child.kill()
                child.wait()
