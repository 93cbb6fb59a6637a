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
requeues a job whose start never arrived: ``control.reconcile``).  At
exit the sender is drained (``atexit``); tests wait with :func:`wait_sent`.

``AGENT_SEND_IN_BACKGROUND=0`` sends in the committing thread instead.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence

from utilities.background import DRAIN_WAIT_S, OrderedWorker, PerProcess
from workers.protocol import Command

log = logging.getLogger(__name__)

Batch = Sequence[tuple[str, Command]]
Send = Callable[[Batch], None]


class CommandSender(OrderedWorker[Batch]):
    """A daemon thread that sends each handed-over batch with its ``send``, first in first out."""

    def __init__(self) -> None:
        super().__init__("agent-command-sender")

    @property
    def sent_batches(self) -> int:
        """Batches through their ``send``."""
        return self.done

    @property
    def failed_batches(self) -> int:
        """Batches whose ``send`` raised."""
        return self.failed


_senders: PerProcess[CommandSender] = PerProcess(CommandSender)


def sender() -> CommandSender:
    """This process's sender, made on first use (and again in a forked child: threads don't fork)."""
    return _senders.get()


def wait_sent(timeout: float = DRAIN_WAIT_S) -> bool:
    """Wait until this process's handed-over commands are published (tests, exit)."""
    return _senders.wait_idle(timeout)


@atexit.register
def _drain_at_exit() -> None:
    # A command-line action or a worker that exits right after a commit still sends it.
    if not wait_sent():
        log.warning("exiting with agent commands not yet sent")
