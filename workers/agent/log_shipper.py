"""Every byte a training process writes, shipped to the control plane as ``log_lines``.

::

    worker's log file (launch.spawn appends stdout+stderr)
        │  bytes [offset, EOF)
        ▼
    LogShipper.ship(records)      at most once a second per worker (flush: now, to EOF)
        ├── identify the file     log_id = <node>-<inode>-<hash of its first 64 bytes>
        ├── read ≤ 64 KiB         cut after the last newline (a long line: at a character)
        ├── send LogLines         text decoded as UTF-8 with replacement, size in bytes
        └── remember the offset   Redis hash agent:<node>:logs  "<job>/<worker>" -> JSON

The offset is saved after each report is handed to ``send`` (unless ``send``
returns False: the broker refused it, and the next pass tries again), so a restarted
agent goes on where the last one stopped: a line is neither sent twice nor
lost (the control plane drops a range it already holds, should a report be
sent and the agent die before saving).  A file that was deleted and created
again has another inode or is shorter than the saved offset: it gets a new
``log_id`` and is read from its start.  The id depends on the file alone, so
an agent that lost its offsets computes the same id and the control plane
recognises the resent bytes.

A trailing line without its newline waits for the rest of it, at most
``partial_line_seconds`` (a progress bar or a prompt shows up all the same);
a worker's final flush sends it at once.

Pure Python and the agent's Redis: no Django.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from workers.clock import Clock
from workers.protocol import LOG_TEXT_MAX_CHARS, LogLines, Report

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = LOG_TEXT_MAX_CHARS
"""Bytes of a log file per report (a byte never decodes to more than one character)."""

SHIP_INTERVAL_SECONDS = 1.0
PARTIAL_LINE_SECONDS = 5.0
MAX_REPORTS_PER_PASS = 16
"""Reports per worker per pass (16 x 64 KiB a second); a busier writer catches up later."""

FINGERPRINT_BYTES = 64


class WorkerLike(Protocol):
    """What the shipper needs of a process record (``store.WorkerRecord``)."""

    @property
    def job(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def log_path(self) -> str: ...


@dataclass(frozen=True)
class LogPosition:
    """How far one worker's log file has been shipped."""

    log_id: str
    inode: int
    offset: int


class LogOffsets:
    """The shipped offsets, in the agent's Redis (``agent:<node>:<kind>``: ``logs``, or
    ``metrics`` for the metrics files, ``workers.agent.metrics_tail``)."""

    def __init__(self, client: redis.Redis, node: str, kind: str = "logs") -> None:
        self.redis = client
        self.key = f"agent:{node}:{kind}"

    def get(self, job: str, worker_id: str) -> LogPosition | None:
        """The saved position of a worker's log, or None."""
        raw: Any = self.redis.hget(self.key, f"{job}/{worker_id}")
        if not raw:
            return None
        try:
            return LogPosition(**json.loads(raw))
        except (TypeError, ValueError):
            log.warning("unreadable log offset for %s/%s: %r", job, worker_id, raw)
            return None

    def save(self, job: str, worker_id: str, position: LogPosition) -> None:
        """Remember a position."""
        self.redis.hset(self.key, f"{job}/{worker_id}", json.dumps(asdict(position)))

    def drop(self, job: str, worker_id: str) -> None:
        """Forget a worker's position."""
        self.redis.hdel(self.key, f"{job}/{worker_id}")


def log_id_of(node: str, inode: int, head: bytes) -> str:
    """The id of a log file: its node, inode and a hash of its first bytes."""
    digest = hashlib.sha256(head[:FINGERPRINT_BYTES]).hexdigest()[:12]
    return f"{node}-{inode}-{digest}"


def cut(data: bytes, *, at_eof: bool, final: bool) -> int:
    """How many bytes of ``data`` (read from the shipped offset) to send now.

    Up to the last newline; all of it on a final flush; a chunk of
    ``MAX_REPORT_BYTES`` with no newline at all (one very long line) up to its
    last whole UTF-8 character.  0 means: wait for more.
    """
    if final and at_eof:
        return len(data)
    newline = data.rfind(b"\n")
    if newline >= 0:
        return newline + 1
    if len(data) < MAX_REPORT_BYTES:
        return len(data) if final else 0
    return _whole_characters(data)


def _whole_characters(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 sequence cut off at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)  # ASCII ends it
        if byte >= 0xC0:  # the lead byte of the last sequence
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if need <= back else len(data) - back
    return len(data)  # no lead byte in reach: invalid anyway, send as it is


class LogShipper:
    """Reads what each worker appended to its log and sends it as ``LogLines`` reports."""

    def __init__(
        self,
        node: str,
        offsets: LogOffsets,
        send: Callable[[Report], object],
        clock: Clock,
        *,
        interval: float = SHIP_INTERVAL_SECONDS,
        partial_line_seconds: float = PARTIAL_LINE_SECONDS,
    ) -> None:
        self.node = node
        self.offsets = offsets
        self._send = send
        self.clock = clock
        self.interval = interval
        self.partial_line_seconds = partial_line_seconds
        self._next_pass: dict[tuple[str, str], float] = {}
        self._partial_since: dict[tuple[str, str], float] = {}

    def ship(self, records: Iterable[WorkerLike]) -> None:
        """One pass: ship new output of each worker whose interval has passed."""
        now = self.clock.monotonic()
        for record in records:
            key = (record.job, record.worker_id)
            if now < self._next_pass.get(key, now):
                continue
            self._next_pass[key] = now + self.interval
            try:
                self._ship_one(record, final=False)
            except OSError:
                log.warning("could not read the log of %s/%s", *key, exc_info=True)

    def flush(self, record: WorkerLike) -> None:
        """Ship everything left in an exited worker's log, then stop tracking it in memory.

        The saved offset stays: a worker started again under the same id
        appends to the same file and goes on from there.
        """
        key = (record.job, record.worker_id)
        try:
            self._ship_one(record, final=True)
        except OSError:
            log.warning("could not read the log of %s/%s", *key, exc_info=True)
        self._next_pass.pop(key, None)
        self._partial_since.pop(key, None)

    def _ship_one(self, record: WorkerLike, *, final: bool) -> None:
        key = (record.job, record.worker_id)
        try:
            handle = open(record.log_path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return
        with handle:
            stat = os.fstat(handle.fileno())
            position = self.offsets.get(*key)
            if position is None or position.inode != stat.st_ino or stat.st_size < position.offset:
                head = handle.read(FINGERPRINT_BYTES)
                if not final and len(head) < FINGERPRINT_BYTES and b"\n" not in head:
                    return  # too young to tell apart from a file created again
                position = LogPosition(log_id_of(self.node, stat.st_ino, head), stat.st_ino, 0)
            sent = 0
            while final or sent < MAX_REPORTS_PER_PASS:
                handle.seek(position.offset)
                data = handle.read(MAX_REPORT_BYTES)
                if not data:
                    break
                at_eof = len(data) < MAX_REPORT_BYTES
                size = cut(data, at_eof=at_eof, final=final or self._partial_due(key))
                if size == 0:
                    self._partial_since.setdefault(key, self.clock.monotonic())
                    break
                self._partial_since.pop(key, None)
                if self._send(self._report(record, position, data[:size])) is False:
                    break  # the broker refused it: the same bytes go again next pass
                position = LogPosition(position.log_id, position.inode, position.offset + size)
                self.offsets.save(*key, position)
                sent += 1
                if at_eof and size == len(data):
                    break

    def _partial_due(self, key: tuple[str, str]) -> bool:
        since = self._partial_since.get(key)
        return since is not None and self.clock.monotonic() - since >= self.partial_line_seconds

    def _report(self, record: WorkerLike, position: LogPosition, data: bytes) -> LogLines:
        rank = getattr(record, "rank", None)
        generation = getattr(record, "generation", None)
        return LogLines(
            node=self.node,
            job=record.job,
            worker_id=record.worker_id,
            log_id=position.log_id,
            offset=position.offset,
            text=data.decode("utf-8", errors="replace"),
            size=len(data),
            rank=rank if isinstance(rank, int) else None,
            generation=generation if isinstance(generation, int) else None,
        )
