"""Warm worker processes: one per idle slot, so that a newcomer starts in about a second.

A cold worker spends its first seconds importing torch and building the
model (``docs/benchmarks.md``, "Runtime figures"). With ``AGENT_WARM_WORKERS=1``
the agent keeps, for each idle slot, a ``python -m workers.elastic.warm``
process that has done the imports (and, once a job of this node told it
which, built that job's workload) and waits on its stdin.  Starting a
built-in workload's worker in that slot then writes the worker's command line
to the pipe instead of starting a process.

Only built-in workloads use them, and only where ``SANDBOX=off``: a warm
process is started before its job is known, so it cannot be given the job's
sandbox (its store directory) or its Redis user; a tenant's program runs
sandboxed from its own code (``sandbox.py``), which a warm interpreter of the
agent's code must not become; starting a program in a slot closes that
slot's warm process.  A warm process holds no credential: the job's Redis
URL comes with its assignment, on its stdin.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.agent.config import REPO_ROOT, AgentConfig
from workers.agent.gpus import cuda_visible
from workers.agent.launch import shown_command, spawn
from workers.agent.programs import fixed_env

log = logging.getLogger(__name__)

WARM_ENV = "AGENT_WARM_WORKERS"
"""``1``: keep a warm worker process per idle slot (default off)."""

WARM_MODULE = "workers.elastic.warm"


def enabled_from_env(environ: dict[str, str] | None = None) -> bool:
    """Whether ``AGENT_WARM_WORKERS`` asks for warm processes."""
    value = (os.environ if environ is None else environ).get(WARM_ENV, "0").strip().lower()
    return value in ("1", "true", "yes", "on")


def enabled_for(config: AgentConfig, environ: dict[str, str] | None = None) -> bool:
    """Whether this agent keeps warm processes: asked for, and the sandbox is off."""
    if not enabled_from_env(environ):
        return False
    if config.sandbox.mode != "off":
        log.warning("%s=1 is ignored: warm processes need SANDBOX=off (warm.py)", WARM_ENV)
        return False
    return True


def warm_env(config: AgentConfig, slot: int) -> dict[str, str]:
    """A warm process's environment: a training process's fixed one, no credential."""
    env = fixed_env(config, config.data_dir / "warm" / f"slot{slot}")
    env["PYTHONPATH"] = str(REPO_ROOT)
    if config.device == "cuda" and config.gpus:  # its own GPU only, as cuda:0 (device_for)
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(config.gpus, [slot])
    return env


def warm_argv(config: AgentConfig, slot: int, ahead: tuple[str, str] | None) -> list[str]:
    """The command line of a warm process for ``slot`` (``ahead``: workload and JSON args)."""
    argv = [config.python, "-m", WARM_MODULE, "--device", config.device_for(slot)]
    if ahead is not None:
        argv += ["--workload", ahead[0], "--args", ahead[1]]
    return argv


def assignment(worker_argv: list[str], redis_url: str) -> bytes:
    """What a warm process reads: the worker's arguments after ``python -m <module>``, and
    its job's Redis URL (a pipe, which neither ``ps`` nor the log shows)."""
    if len(worker_argv) < 3 or worker_argv[1] != "-m":
        raise ValueError("not a worker command line (python -m module ...)")
    return (json.dumps([*worker_argv[3:], "--redis-url", redis_url]) + "\n").encode()


@dataclass(frozen=True)
class WarmProcess:
    """A warm process and the log file its output goes to (the worker's, once assigned)."""

    popen: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class WarmPool:
    """The warm processes of one agent, by slot."""

    config: AgentConfig
    enabled: bool = False
    procs: dict[int, WarmProcess] = field(default_factory=dict)
    ahead: tuple[str, str] | None = None
    """The workload (and its JSON arguments) new warm processes build ahead."""
    _count: Any = field(default_factory=itertools.count)

    def fill(self, idle_slots: tuple[int, ...]) -> None:
        """Start a warm process in each idle slot that has none (and forget dead ones)."""
        if not self.enabled:
            return
        for slot, warm in list(self.procs.items()):
            if warm.popen.poll() is not None or slot not in idle_slots:
                self._close(self.procs.pop(slot).popen)
        for slot in idle_slots:
            if slot in self.procs:
                continue
            path = self.config.log_path("_warm", f"slot{slot}-{os.getpid()}-{next(self._count)}")
            try:
                home = self.config.data_dir / "warm" / f"slot{slot}"
                home.mkdir(parents=True, exist_ok=True)
                popen = spawn(
                    warm_argv(self.config, slot, self.ahead),
                    warm_env(self.config, slot),
                    path,
                    stdin=subprocess.PIPE,
                )
            except OSError as exc:
                log.warning("could not start a warm process in slot %d: %s", slot, exc)
                return
            self.procs[slot] = WarmProcess(popen, path)

    def take(self, slot: int) -> WarmProcess | None:
        """The warm process of ``slot``, if one is alive (it leaves the pool)."""
        warm = self.procs.pop(slot, None)
        if warm is not None and warm.popen.poll() is not None:
            return None
        return warm

    def start(
        self, slot: int, worker_argv: list[str], redis_url: str, workload: str, args: str
    ) -> WarmProcess | None:
        """Turn the warm process of ``slot`` into this worker; None: start it cold.

        Later warm processes build ``workload`` ahead (the job that just grew here
        is the likeliest to grow again).
        """
        self.ahead = (workload, args) if self.enabled else None
        warm = self.take(slot)
        if warm is None or warm.popen.stdin is None:
            return None
        try:
            with open(warm.log_path, "ab") as out:
                out.write(f"--- assigned: {shown_command(worker_argv)}\n".encode())
            warm.popen.stdin.write(assignment(worker_argv, redis_url))
            warm.popen.stdin.close()
        except (OSError, ValueError) as exc:
            log.warning("warm process of slot %d refused its assignment: %s", slot, exc)
            self._close(warm.popen)
            return None
        return warm

    def release(self, slot: int) -> None:
        """End the warm process of ``slot`` (a tenant program starts there)."""
        warm = self.procs.pop(slot, None)
        if warm is not None:
            self._close(warm.popen)

    def close(self) -> None:
        """End every warm process (the agent stops)."""
        for slot in list(self.procs):
            self.release(slot)

    @staticmethod
    def _close(proc: subprocess.Popen[bytes]) -> None:
        """End a warm process at once: it holds no state, and the agent's loop must not wait
        for one still importing torch to read its closed pipe."""
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
