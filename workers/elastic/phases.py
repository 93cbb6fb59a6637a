"""Timestamps of a worker's start-up phases: where a newcomer's seconds go.

Off unless ``EDL_PHASE_LOG`` names a file (the benchmark sets it): each phase
is then one JSON line ``{"phase", "t", "pid"}`` appended to it.  No torch here,
so the very first phase is stamped before the heavy imports.
"""

from __future__ import annotations

import json
import os
import time

PHASE_LOG_ENV = "EDL_PHASE_LOG"

PHASES = (
    "python_up",  # the interpreter runs the worker's entry point
    "warm",  # a warm process: imports done, model built, waiting for its job
    "assigned",  # a warm process: the agent handed it its command line
    "imported",  # torch and the runtime imported
    "registered",  # the leader answered the registration with the generation's plan
    "communicator",  # the new generation's process group is built
    "prepared",  # model, optimizer and data built (in parallel with the two above)
    "ready",  # told the leader it is ready; waiting for the switch step
    "state_loaded",  # the training state arrived (broadcast at the switch) and is loaded
    "first_batch",  # the first mini-batch trained and committed
)


def mark(phase: str) -> None:
    """Record that ``phase`` was reached now (a no-op unless ``EDL_PHASE_LOG`` is set)."""
    path = os.environ.get(PHASE_LOG_ENV)
    if not path:
        return
    line = json.dumps({"phase": phase, "t": time.time(), "pid": os.getpid()}) + "\n"
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError:  # a measurement aid: never the reason a worker fails
        pass


def read(path: str) -> dict[str, float]:
    """The first time of each phase in a phase log (for the benchmark)."""
    times: dict[str, float] = {}
    try:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                times.setdefault(str(record["phase"]), float(record["t"]))
    except FileNotFoundError:
        pass
    return times
