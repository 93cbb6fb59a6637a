"""Wall-clock time of the tick's phases, for ``bench/tick.py --phases``.

cProfile (``--profile``) doubles the cost of Python and hides where a tick waits;
these timers only read the clock around a fixed list of the tick's functions,
in the tick's own thread and only while a measured tick runs, and report each
phase's median over the incremental ticks.  Phases nest (``apply_bound``
holds ``Batch.flush``): they do not add up to the tick.
"""

from __future__ import annotations

import functools
import importlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (module, attribute path, label): what the tick spends its time in, outermost first.
PHASES = (
    ("control.tick", "_tick", "tick body"),
    ("control.tick", "_database_lock", "database lock"),
    ("control.tick", "read_beats", "heartbeats"),
    ("control.tick", "_recover_lost_gpus", "lost GPUs"),
    ("control.tick", "reconcile", "reconcile"),
    ("control.tick", "apply_bound", "apply_bound"),
    ("control.tick", "note_waiting", "waits noted"),
    ("control.tick", "_release", "lock release"),
    ("control.incremental", "KeptState.cluster", "refresh"),
    ("control.incremental", "_written_since", "refresh: job rows"),
    ("control.incremental", "_servers_changed", "refresh: servers"),
    ("control.incremental", "KeptState.verify_if_due", "verify"),
    ("control.assembly", "Assembly.assemble", "snapshot"),
    ("scheduler.pipeline", "PolicyDecide.decide", "policy"),
    ("scheduler.pipeline", "AllocatorBind.bind", "binding"),
    ("control.apply", "locked_jobs", "apply: locked read"),
    ("jobs.lifecycle", "Batch.flush", "apply: writes"),
    ("control.apply", "membership_commands", "apply: commands"),
    ("jobs.holdings", "store_many", "apply: holdings"),
)


class PhaseTimer:
    """Times :data:`PHASES` inside :meth:`measuring` blocks; the medians per phase."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.active = False
        self.current: dict[str, float] = {}
        self.ticks: list[dict[str, float]] = []

    def install(self) -> None:
        """Wrap every phase's function (after Django is set up)."""
        for module_name, path, label in PHASES:
            owner: Any = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active or threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = (time.perf_counter() - start) * 1000
                self.current[label] = self.current.get(label, 0.0) + elapsed

        return timed

    @contextmanager
    def measuring(self, keep: bool) -> Iterator[None]:
        """Time the block's phases; keep them as one tick's when ``keep``."""
        self.active, self.current = True, {}
        try:
            yield
        finally:
            self.active = False
            if keep:
                self.ticks.append(self.current)

    def medians(self) -> dict[str, float]:
        """Each phase's median over the kept ticks (0 in a tick that did not run it)."""
        return {
            label: round(statistics.median(tick.get(label, 0.0) for tick in self.ticks), 2)
            for _, _, label in PHASES
            if self.ticks
        }
