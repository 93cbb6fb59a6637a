"""Live-update plumbing: group names, after-commit broadcasts, per-group coalescing and seqs.

Payloads are small JSON dicts with a ``type`` key (ids and diffs, never whole
views).  They are sent only after the transaction that made the change commits::

    service (in a transaction)
      └─ broadcast_on_commit(groups, payload, replaces=key)   one hook per transaction
         messages_on_commit(make)                              payloads built after commit
         on_commit_once(key, factory, update)                  e.g. a tenant's new counts,
                                                               built once at commit
    commit
      └─ the transaction's messages and finishers ──> finisher thread (one per process,
         LIVE_FINISH_IN_BACKGROUND; else the committing thread): finishers run, then
         all of the transaction's messages together ──> Coalescer (one per process, its own thread)
            per group: the first message of a quiet group goes at once; later ones
            within COALESCE_SECONDS wait and go together, as ONE channel message:
            {"type": "portal.batch", "group": g, "seq": n, "events": [patch, ...]}
            groups whose window closed go out in rounds: n = INCR portal:live-seq:<g>
            for the whole round in one pipeline, then at most SEND_CONCURRENCY
            group_sends in flight (a tick that touches 1,000 groups loses none)

A page keeps the last ``seq`` of each topic and reloads its snapshot only on a
gap or a reconnect; a snapshot carries the ``seq`` it reflects (:func:`current_seq`).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, transaction

from utilities.background import DRAIN_WAIT_S, OrderedWorker, PerProcess

log = logging.getLogger(__name__)

CLUSTER_GROUP = "cluster"
SEQ_KEY = "portal:live-seq:{group}"
SEQ_TTL_S = 7 * 24 * 3600
"""A group's counter lives a week past its last event; a page that finds it gone reloads once."""
DEFAULT_COALESCE_SECONDS = 0.1
DEFAULT_SEND_CONCURRENCY = 16
"""Group sends in flight at once, well under the channel layer's 100 connections per loop."""
ROUND_MAX_GROUPS = 1000
"""Groups per round: one seq pipeline of at most this many INCRs."""
FLUSH_WAIT_S = 2.0


def tenant_group(tenant_id: int) -> str:
    """The group that a tenant's members join to follow its jobs."""
    return f"tenant-{tenant_id}"


def job_group(job_id: int) -> str:
    """The group that a job's detail page joins."""
    return f"job-{job_id}"


@dataclass(frozen=True)
class Message:
    """One payload for some groups; ``replaces`` names what a later message with that key supersedes."""

    groups: tuple[str, ...]
    payload: dict[str, Any]
    replaces: str | None = None


def coalesce(pending: Iterable[tuple[str | None, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The patches of one group's window in order; a keyed patch keeps only its latest version.

    A keyed patch (a tenant's counts) is an absolute value: its latest version
    says all the earlier ones did, and it takes the place of the last one sent.
    """
    out: list[tuple[str | None, dict[str, Any]]] = []
    for key, payload in pending:
        if key is not None:
            out = [(k, p) for k, p in out if k != key]
        out.append((key, payload))
    return [payload for _, payload in out]


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


_seq_reader: tuple[int, redis.Redis] | None = None


def _seq_client() -> redis.Redis:
    # One client (and connection pool) per process: a new one per snapshot was a new
    # TCP connection per page load.
    global _seq_reader
    if _seq_reader is None or _seq_reader[0] != os.getpid():
        _seq_reader = (os.getpid(), _redis())
    return _seq_reader[1]


def current_seq(group: str) -> int:
    """The seq of the last batch sent to ``group`` (0 if none): what a snapshot reflects.

    Read before the snapshot's queries: every batch up to it was sent after its
    transaction committed, so the snapshot includes its changes.  0 when Redis is away.
    """
    try:
        value = _seq_client().get(SEQ_KEY.format(group=group))
    except redis.RedisError:
        log.warning("could not read the live seq of %s", group, exc_info=True)
        return 0
    return int(value or 0)


@dataclass
class _GroupWindow:
    """A group's patches waiting for its window to close, and when it last sent."""

    pending: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    last_sent: float = float("-inf")
    scheduled: bool = False


class Coalescer:
    """Sends each group's patches as one message per window, from its own thread and loop.

    One per process (made again after a fork: Celery's workers are forked).
    ``window_s`` is the least time between two messages to one group; the first
    message to a quiet group waits for nothing.

    Groups whose window closed wait in ``ready`` and go out in rounds: one Redis
    pipeline takes the seqs of a whole round, then at most ``concurrency`` sends are
    in flight at once.  A tick that changes 1,000 jobs closes 1,000+ windows in the
    same instant; sent all at once they would need more connections than the
    channel layer's pool holds (100 per loop), and the sends it refused were lost.
    Rounds run one after another, so a group's batches reach the layer in seq order.
    """

    def __init__(
        self,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        concurrency: int = DEFAULT_SEND_CONCURRENCY,
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self.concurrency = concurrency
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.groups: dict[str, _GroupWindow] = {}
        self.ready: dict[str, list[tuple[str | None, dict[str, Any]]]] = {}
        self.draining = False
        self.busy = 0
        self.idle = threading.Condition()
        self.sent_messages = 0
        self.failed_messages = 0
        self.redis = _redis()
        self.thread = threading.Thread(target=self._run, name="live-coalescer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, messages: list[Message]) -> None:
        """Queue one transaction's messages (thread-safe; returns at once)."""
        with self.idle:
            self.busy += 1
        self.loop.call_soon_threadsafe(self._add, messages)

    def _add(self, messages: list[Message]) -> None:
        try:
            for message in messages:
                for group in message.groups:
                    window = self.groups.setdefault(group, _GroupWindow())
                    window.pending.append((message.replaces, message.payload))
                    if not window.scheduled:
                        window.scheduled = True
                        wait = max(0.0, window.last_sent + self.window_s - self.clock())
                        self.busy_add(1)
                        self.loop.call_later(wait, self._flush, group)
        finally:
            self.busy_add(-1)

    def busy_add(self, delta: int) -> None:
        with self.idle:
            self.busy += delta
            if self.busy == 0:
                self.idle.notify_all()

    def _flush(self, group: str) -> None:
        window = self.groups[group]
        window.scheduled = False
        window.last_sent = self.clock()
        waiting = self.ready.get(group)
        if waiting is None:
            self.ready[group] = window.pending
        else:  # its previous batch has not gone yet (a long round): one batch for both
            waiting.extend(window.pending)
            self.busy_add(-1)
        window.pending = []
        if not self.draining:
            self.draining = True
            self.loop.create_task(self._drain())
        self.loop.call_later(self.window_s * 2, self._forget, group)

    def _forget(self, group: str) -> None:
        # A quiet group's window is dropped, so job groups do not pile up in memory.
        window = self.groups.get(group)
        if window is None or window.scheduled:
            return
        if window.last_sent + self.window_s <= self.clock():
            del self.groups[group]

    async def _drain(self) -> None:
        """Send the ready groups round after round until none is left."""
        try:
            while self.ready:
                round_ = dict(itertools.islice(self.ready.items(), ROUND_MAX_GROUPS))
                for group in round_:
                    del self.ready[group]
                await self._send_round(round_)
        finally:
            self.draining = False

    def _next_seqs(self, groups: list[str]) -> list[int]:
        # One round trip for the whole round, however many groups it has.
        with self.redis.pipeline(transaction=False) as pipe:
            for group in groups:
                key = SEQ_KEY.format(group=group)
                pipe.incr(key)
                pipe.expire(key, SEQ_TTL_S)
            replies = pipe.execute()
        return [int(seq) for seq in replies[::2]]

    async def _send_round(self, round_: dict[str, list[tuple[str | None, dict[str, Any]]]]) -> None:
        layer = get_channel_layer()
        groups = list(round_)
        try:
            if layer is None:
                raise RuntimeError("no channel layer is configured")
            seqs = self._next_seqs(groups)
        except Exception:  # committed changes; the pages that miss them see the gap
            self.failed_messages += len(groups)
            self.busy_add(-len(groups))
            log.warning("could not number %d live batches", len(groups), exc_info=True)
            return
        limit = asyncio.Semaphore(self.concurrency)

        async def send(group: str, seq: int) -> None:
            events = coalesce(round_[group])
            message = {"type": "portal.batch", "group": group, "seq": seq, "events": events}
            try:
                async with limit:
                    await layer.group_send(group, message)
                self.sent_messages += 1
            except Exception:  # the change is committed; a page that misses it sees the gap
                self.failed_messages += 1
                log.warning(
                    "could not broadcast %d live updates to %s", len(events), group, exc_info=True
                )
            finally:
                self.busy_add(-1)

        await asyncio.gather(*(send(group, seq) for group, seq in zip(groups, seqs, strict=True)))

    def wait_idle(self, timeout: float = FLUSH_WAIT_S) -> bool:
        """Block until everything submitted has been sent (tests, exit); False on timeout."""
        with self.idle:
            return self.idle.wait_for(lambda: self.busy == 0, timeout)


_coalescer_lock = threading.Lock()
_coalescer: Coalescer | None = None


def coalescer() -> Coalescer:
    """This process's coalescer (started on first use, again after a fork)."""
    global _coalescer
    with _coalescer_lock:
        if _coalescer is None or _coalescer.pid != os.getpid():
            window = float(getattr(settings, "LIVE_COALESCE_SECONDS", DEFAULT_COALESCE_SECONDS))
            _coalescer = Coalescer(window)
        return _coalescer


@atexit.register
def _drain_at_exit() -> None:
    # A management command or a worker that exits right after a commit still delivers it.
    wait_finished()
    if _coalescer is not None and _coalescer.pid == os.getpid():
        _coalescer.wait_idle()


def broadcast_now(messages: Iterable[Message]) -> None:
    """Hand committed messages to the coalescer; they go out within one window.

    A layer outage is logged, never raised: the change is already committed,
    and a page that missed an update sees the gap in seqs and resynchronises.
    """
    batch = list(messages)
    if batch and get_channel_layer() is not None:
        coalescer().submit(batch)


class Finisher(Protocol):
    """Per-transaction work run once at commit that yields more messages (e.g. counts)."""

    def __call__(self) -> Iterable[Message]: ...


F = TypeVar("F", bound=Finisher)


class _CommitBatch:
    """The live updates of one transaction, sent together by a single on-commit hook."""

    def __init__(self) -> None:
        self.messages: list[Message | MessageMaker] = []
        self.finishers: dict[str, Finisher] = {}

    def __call__(self) -> None:
        work = (list(self.finishers.items()), list(self.messages))
        if settings.LIVE_FINISH_IN_BACKGROUND:
            # Every transaction's batch goes this way, with finishers or not, so none
            # overtakes an earlier one still being finished.
            _finishers.get().submit(_finish_in_background, work)
        else:
            _finish(work)


MessageMaker = Callable[[], Iterable[Message]]
"""Makes a transaction's messages after commit, from values it captured (``messages_on_commit``)."""
Finishing = tuple[list[tuple[str, Finisher]], list[Message | MessageMaker]]
"""A transaction's finishers and its own messages, which go out with what the finishers make."""


def _finish(work: Finishing) -> None:
    """Make the messages and run the finishers (their queries see every commit so far);
    send all in one hand-over, in the order the transaction made them."""
    finishers, messages = work
    out: list[Message] = []
    for item in messages:
        if isinstance(item, Message):
            out.append(item)
            continue
        try:
            out.extend(item())
        except Exception:  # one page's patch is a courtesy; the others still go
            log.warning("live message maker failed", exc_info=True)
    for key, finish in finishers:
        try:
            out.extend(finish())
        except Exception:  # counts are a courtesy; the job events still go
            log.warning("live finisher %s failed", key, exc_info=True)
    broadcast_now(out)


def _finish_in_background(work: Finishing) -> None:
    """:func:`_finish` in the finisher thread, which then drops a broken or expired connection."""
    try:
        _finish(work)
    finally:
        close_old_connections()


_finishers: PerProcess[OrderedWorker[Finishing]] = PerProcess(
    lambda: OrderedWorker("live-finisher")
)
"""The thread that runs committed transactions' finishers, in commit order (one per process)."""


def finishers_held() -> AbstractContextManager[None]:
    """Start no finisher until the block ends (``OrderedWorker.held``): for a caller whose
    last steps after its commit must not share the interpreter with them (the tick)."""
    if not settings.LIVE_FINISH_IN_BACKGROUND:
        return nullcontext()
    return _finishers.get().held()


def wait_finished(timeout: float = DRAIN_WAIT_S) -> bool:
    """Wait until this process's finishers handed to the background have run (tests, exit)."""
    return _finishers.wait_idle(timeout)


_local = threading.local()


def _transaction_batch() -> _CommitBatch | None:
    """The current transaction's batch (made and hooked on first use); None in autocommit."""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        return None
    batch: _CommitBatch | None = getattr(_local, "batch", None)
    registered = batch is not None and any(
        hook is batch for _, hook, *_ in connection.run_on_commit
    )
    if batch is None or not registered:
        batch = _CommitBatch()
        _local.batch = batch
        transaction.on_commit(batch)
    return batch


def broadcast_on_commit(
    groups: Iterable[str], payload: dict[str, Any], *, replaces: str | None = None
) -> None:
    """Send ``payload`` to ``groups`` once the current transaction commits.

    All updates of a transaction share one hook (a tick that changes hundreds
    of jobs pays for one hand-over, not hundreds).  The batch belongs to
    the transaction: after a rollback its hook is gone and a new one is made.
    """
    message = Message(tuple(groups), payload, replaces)
    batch = _transaction_batch()
    if batch is None:  # autocommit: the change is already committed
        broadcast_now([message])
        return
    batch.messages.append(message)


def messages_on_commit(make: MessageMaker) -> None:
    """Have ``make()``'s messages sent once the current transaction commits.

    For payloads that cost something to build (a job's three patches): ``make``
    runs after commit, in the finisher thread when ``LIVE_FINISH_IN_BACKGROUND``,
    so the committing thread only captures what it needs.  Its messages keep
    their place among the transaction's others; in autocommit it runs at once.
    """
    batch = _transaction_batch()
    if batch is None:
        broadcast_now(list(make()))
        return
    batch.messages.append(make)


def on_commit_once(key: str, factory: Callable[[], F], update: Callable[[F], None]) -> None:
    """Apply ``update`` to this transaction's ``key`` finisher (made by ``factory`` once).

    The finisher runs once at commit, after the transaction's own messages, and
    its messages go in the same batch; in autocommit it runs at once.
    """
    batch = _transaction_batch()
    if batch is None:
        finisher = factory()
        update(finisher)
        broadcast_now(list(finisher()))
        return
    existing = batch.finishers.get(key)
    if existing is None:
        made = factory()
        batch.finishers[key] = made
        update(made)
    else:
        update(existing)  # type: ignore[arg-type]  # one factory per key
