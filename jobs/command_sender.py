"""One thread per process that puts committed agent commands on the nodes' queues, in order.

A tick commits its decisions and is done: the commands that carry them out go
to the agents after the commit (``jobs.outbox``), one Celery message each, and
publishing costs a millisecond or two of CPU per command (Celery builds and
serialises each message), more than the tick's own work on a job.  So the committing thread hands the batch to this
process's sender and returns; the sender publishes batches one at a time, in
the order they were handed over (a job's commands from two ticks never
overtake each other), over one broker connection.

What a process loses if it dies between the hand-over and the publishing (a
window of milliseconds) is what it lost before when it died between the
commit and a synchronous send, and it recovers the same way (reconcile
requeues a job whose start never arrived: ``jobs.control.reconcile``).  At
exit the sender is drained (``atexit``); tests wait with :func:`wait_sent`.

``AGENT_SEND_IN_BACKGROUND=0`` sends in the committing thread instead.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence

from workers.protocol import Command

log = logging.getLogger(__name__)

Batch = Sequence[tuple[str, Command]]
DRAIN_WAIT_S = 10.0
"""How long :func:`wait_sent` and the exit drain wait for the batches handed over."""


Send = Callable[[Batch], None]


class CommandSender:
    """A daemon thread that sends each handed-over batch with its ``send``, first in first out."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.batches: queue.SimpleQueue[tuple[Send, Batch]] = queue.SimpleQueue()
        self.unsent = 0  # batches handed over and not yet through ``send``
        self.idle = threading.Condition()
        self.sent_batches = 0
        self.failed_batches = 0
        self.thread = threading.Thread(target=self._run, name="agent-command-sender", daemon=True)
        self.thread.start()

    def submit(self, send: Send, batch: Batch) -> None:
        """Queue one committed batch, to go out as ``send(batch)`` (thread-safe; returns at once)."""
        with self.idle:
            self.unsent += 1
        self.batches.put((send, batch))

    def _run(self) -> None:
        while True:
            send, batch = self.batches.get()
            try:
                send(batch)
                self.sent_batches += 1
            except Exception:  # ``send`` logs its own failures; this keeps the thread alive
                self.failed_batches += 1
                log.exception("the agent command sender failed on %d commands", len(batch))
            finally:
                with self.idle:
                    self.unsent -= 1
                    if self.unsent == 0:
                        self.idle.notify_all()

    def wait_idle(self, timeout: float = DRAIN_WAIT_S) -> bool:
        """Block until every batch handed over has been sent (or failed); False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: self.unsent == 0, timeout)


_lock = threading.Lock()
_sender: CommandSender | None = None


def sender() -> CommandSender:
    """This process's sender, made on first use (and again in a forked child: threads don't fork)."""
    global _sender
    with _lock:
        if _sender is None or _sender.pid != os.getpid():
            _sender = CommandSender()
        return _sender


def wait_sent(timeout: float = DRAIN_WAIT_S) -> bool:
    """Wait until this process's handed-over commands are published (tests, exit)."""
    current = _sender
    if current is None or current.pid != os.getpid():
        return True
    return current.wait_idle(timeout)


@atexit.register
def _drain_at_exit() -> None:
    # A command-line action or a worker that exits right after a commit still sends it.
    if not wait_sent():
        log.warning("exiting with agent commands not yet sent")
