"""A thread per process that runs handed-over work after commit, in the order it was handed over.

Work that follows a commit but that the committing thread need not wait for
(publishing agent commands, building the live summaries pages show) goes to
such a thread: the transaction's caller returns at once, and what it handed
over runs one item at a time, first in first out.  Threads do not survive a
fork (Celery's workers are forked), so each is made on first use in each
process (:class:`PerProcess`); at exit the work handed over is drained.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

DRAIN_WAIT_S = 10.0
"""How long a wait for the work handed over (tests, the exit drain) lasts by default."""

Item = TypeVar("Item")


class OrderedWorker(Generic[Item]):
    """A daemon thread that calls each handed-over ``work(item)``, first in first out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid = os.getpid()
        self.items: queue.SimpleQueue[tuple[Callable[[Item], None], Item]] = queue.SimpleQueue()
        self.pending = 0  # items handed over and not yet through their work
        self.idle = threading.Condition()
        self.done = 0
        self.failed = 0
        self.holds = 0  # open :meth:`held` blocks
        self.waiting: list[tuple[Callable[[Item], None], Item]] = []  # submitted while held
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, work: Callable[[Item], None], item: Item) -> None:
        """Queue ``work(item)`` (thread-safe; returns at once)."""
        with self.idle:
            self.pending += 1
            if self.holds:
                self.waiting.append((work, item))
            else:
                self.items.put((work, item))

    @contextmanager
    def held(self) -> Iterator[None]:
        """Start no work until the block ends; what is submitted meanwhile, from any
        thread, is queued then, in the order it came.

        For a caller whose own remaining work is short and must not wait: the
        thread's work competes with it for the interpreter (the scheduler tick
        hands over its commands at commit, then still releases its lock; a
        publishing thread woken at commit added about 2 ms to a 25 ms tick).
        """
        with self.idle:
            self.holds += 1
        try:
            yield
        finally:
            with self.idle:
                self.holds -= 1
                if not self.holds:
                    for entry in self.waiting:
                        self.items.put(entry)
                    self.waiting.clear()

    def _run(self) -> None:
        while True:
            work, item = self.items.get()
            try:
                work(item)
                self.done += 1
            except Exception:  # the work logs its own failures; this keeps the thread alive
                self.failed += 1
                log.exception("background work of %s failed", self.name)
            finally:
                with self.idle:
                    self.pending -= 1
                    if self.pending == 0:
                        self.idle.notify_all()

    def wait_idle(self, timeout: float = DRAIN_WAIT_S) -> bool:
        """Block until everything handed over has run (or failed); False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)


Worker = TypeVar("Worker", bound=OrderedWorker)  # type: ignore[type-arg]


class PerProcess(Generic[Worker]):
    """This process's worker made by ``make``: on first use, and again in a forked child."""

    def __init__(self, make: Callable[[], Worker]) -> None:
        self.make = make
        self.lock = threading.Lock()
        self.worker: Worker | None = None

    def get(self) -> Worker:
        """The worker of this process (made now if it has none)."""
        with self.lock:
            if self.worker is None or self.worker.pid != os.getpid():
                self.worker = self.make()
            return self.worker

    def wait_idle(self, timeout: float = DRAIN_WAIT_S) -> bool:
        """Wait until this process's handed-over work has run; True when it has none."""
        current = self.worker
        if current is None or current.pid != os.getpid():
            return True
        return current.wait_idle(timeout)
