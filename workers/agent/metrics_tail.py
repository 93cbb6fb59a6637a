"""Tailing each torchrun worker's ``METRICS_FILE`` into ``metrics`` reports.

::

    <job dir>/scratch/<worker>/metrics.jsonl   (the program appends JSON lines)
        │  opened with O_NOFOLLOW | O_NONBLOCK under its directory's fd;
        │  refused unless a regular file with one link (a symlink to /etc/passwd,
        │  a FIFO that would block the agent, a hard link: counted once, never read)
        │  bytes [offset, offset + MAX_READ_BYTES), at most once a second per worker
        ▼
    scan + parse_metric_line (workers.agent.metrics_file)
        ├── within MAX_LINES_PER_S (a token bucket per worker file)
        ├── points ──▶ one Metrics report (the report ctx.log_metrics's events become)
        └── refused lines ──▶ counted; one EventsDropped report per worker at most
                              every DROPPED_REPORT_EVERY_S, and at the worker's exit

The offset is saved in the agent's Redis (``agent:<node>:metrics``, as the
log shipper saves its own) after the report is handed to ``send``, so a
restarted agent goes on where the last one stopped; a file created again
(another inode, or shorter than the offset) is read from its start.  A
report's ``event_id`` names the worker, the inode and the offset of its first
line, so the control plane drops one it already holds.

Nothing a file holds is raised out of ``tail`` or ``flush``.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers.agent.events import DROPPED_REPORT_EVERY_S, Dropped
from workers.agent.log_shipper import LogOffsets, LogPosition, WorkerLike
from workers.agent.metrics_file import (
    Line,
    MetricLineRefused,
    Scan,
    parse_metric_line,
    scan,
)
from workers.clock import Clock
from workers.job_events import EventBudget, safe_text
from workers.protocol import EventsDropped, MetricPoint, Metrics, Report
from workers.runtime_events import MAX_POINTS_PER_EVENT

log = logging.getLogger(__name__)

READ_EVERY_S = 1.0
"""How often, at most, one worker's file is read (so at most one report a second)."""

MAX_READ_BYTES = 64 * 1024
"""The most bytes of one file read in one pass (a busier writer's lines wait)."""

MAX_LINES_PER_S = 20.0
"""Lines per second a worker's file may hold on average; the rest are dropped and counted."""

BURST_LINES = 100.0
"""Lines a quiet file may hold at once (below ``MAX_POINTS_PER_EVENT``: one report carries them)."""

FINAL_READS = 16
"""The most reads of a file once its worker exited (``flush``): 1 MiB."""

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""O_NOFOLLOW: a link is refused, not followed; O_NONBLOCK: a FIFO cannot block the agent."""


class FileRefused(OSError):
    """The path holds something the agent will not read (a link, a FIFO, a directory...)."""


def open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file with one link; None if absent.

    The directory is opened first, also without following a link, and the
    file is looked at by name under it before it is opened: anything but a
    regular file (a link, a FIFO, a device) is refused without being opened,
    and the file opened must be the one looked at.  ``FileRefused`` says why.
    """
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FileRefused(f"its folder cannot be opened ({_code(exc)})") from None
    try:
        return _open_in(folder, path.name)
    finally:
        os.close(folder)


def _open_in(folder: int, name: str) -> int | None:
    """``open_regular``'s look and open of ``name`` under the directory ``folder``."""
    try:
        seen = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(seen.st_mode):
            raise FileRefused("it is a symbolic link")
        _check_regular(seen)
        fd = os.open(name, OPEN_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return None
    except FileRefused:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since it was looked at
            raise FileRefused("it is a symbolic link") from None
        raise FileRefused(f"it cannot be opened ({_code(exc)})") from None
    info = os.fstat(fd)
    try:
        _check_regular(info)
        if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
            raise FileRefused("it was replaced while it was opened")
    except FileRefused:
        os.close(fd)
        raise
    return fd


def _check_regular(info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused("it is not a file")
    if info.st_nlink != 1:
        raise FileRefused("it is a regular file with other links")


def _code(exc: OSError) -> str:
    """The errno's name (``EACCES``), for a reason that says why without a path."""
    return errno.errorcode.get(exc.errno or 0, "error")


@dataclass
class Tailed:
    """One worker's metrics file as the tail knows it."""

    position: LogPosition | None
    skipping: bool = False
    refused: str | None = None
    next_read: float = 0.0
    dropped: Dropped = field(default_factory=Dropped)
    next_dropped_report: float = 0.0


@dataclass(frozen=True)
class Batch:
    """What one read of a file gives: the points, the refusals, and the position after it."""

    points: tuple[MetricPoint, ...]
    refused: tuple[tuple[int, str], ...]
    first_offset: int
    after: LogPosition
    skipping: bool


class MetricsFileTail:
    """Reads what each torchrun worker appended to its metrics file; sends it as reports."""

    def __init__(
        self,
        node: str,
        offsets: LogOffsets,
        send: Callable[[Report], object],
        clock: Clock,
        path_of: Callable[[WorkerLike], Path],
    ) -> None:
        self.node = node
        self.offsets = offsets
        self._send = send
        self.clock = clock
        self._path_of = path_of
        self.budget = EventBudget(events_per_s=MAX_LINES_PER_S, burst_events=BURST_LINES)
        self.files: dict[tuple[str, str], Tailed] = {}

    def tail(self, records: Iterable[WorkerLike]) -> None:
        """One pass: read each torchrun worker's file whose interval has passed.  Never raises."""
        now = self.clock.monotonic()
        for record in records:
            if getattr(record, "launcher", None) != "torchrun":
                continue
            try:
                self._tail_one(record, now)
            except Exception:  # Redis away: this file waits, the agent's pass goes on
                log.warning("could not tail the metrics of %s", record.worker_id, exc_info=True)

    def _tail_one(self, record: WorkerLike, now: float) -> None:
        tailed = self._tailed(record)
        if now < tailed.next_read:
            return
        tailed.next_read = now + READ_EVERY_S
        self._read_safely(record, tailed, final=False)
        self._report_dropped(record, tailed, now=False)

    def flush(self, record: WorkerLike) -> None:
        """Read an exited worker's file to its end (a last line without newline counts), then
        forget it here (its offset stays saved).  Never raises."""
        if getattr(record, "launcher", None) != "torchrun":
            return
        try:
            tailed = self._tailed(record)
            for _ in range(FINAL_READS):
                if not self._read_safely(record, tailed, final=True):
                    break
            self._report_dropped(record, tailed, now=True)
        except Exception:  # the exit report must still go out
            log.warning("could not flush the metrics of %s", record.worker_id, exc_info=True)
        finally:
            self.files.pop((record.job, record.worker_id), None)
            self.budget.forget(f"{record.job}/{record.worker_id}")

    def forget(self, job: str, worker_id: str) -> None:
        """Drop a worker's saved offset (its directory was removed)."""
        self.offsets.drop(job, worker_id)

    def _tailed(self, record: WorkerLike) -> Tailed:
        key = (record.job, record.worker_id)
        tailed = self.files.get(key)
        if tailed is None:
            tailed = self.files[key] = Tailed(position=self.offsets.get(*key))
        return tailed

    def _read_safely(self, record: WorkerLike, tailed: Tailed, *, final: bool) -> bool:
        """Read and send once; whether there may be more.  Never raises."""
        try:
            return self._read(record, tailed, final=final)
        except FileRefused as exc:
            self._refuse_file(record, tailed, str(exc))
        except Exception:  # a file that vanished mid-read, Redis away: the next pass reads again
            log.warning(
                "could not read the metrics file of %s/%s",
                record.job,
                record.worker_id,
                exc_info=True,
            )
        return False

    def _refuse_file(self, record: WorkerLike, tailed: Tailed, reason: str) -> None:
        """Count a refused file once while it stays so (not once a pass)."""
        if tailed.refused == reason:
            return
        tailed.refused = reason
        log.warning("job %s: METRICS_FILE of %s refused: %s", record.job, record.worker_id, reason)
        tailed.dropped.add(_event_id(record, 0, 0), f"METRICS_FILE refused: {reason}")

    def _read(self, record: WorkerLike, tailed: Tailed, *, final: bool) -> bool:
        fd = open_regular(self._path_of(record))
        if fd is None:
            return False
        try:
            tailed.refused = None
            batch = self._batch(record, tailed, fd, final=final)
        finally:
            os.close(fd)
        if batch is None:
            return False
        if batch.points:
            report = Metrics(
                node=self.node,
                job=record.job,
                event_id=_event_id(record, batch.after.inode, batch.first_offset),
                points=batch.points,
            )
            if self._send(report) is False:
                return False  # the broker refused it: the same lines go again next pass
        for offset, reason in batch.refused:
            tailed.dropped.add(_event_id(record, batch.after.inode, offset), reason)
        tailed.position, tailed.skipping = batch.after, batch.skipping
        self.offsets.save(record.job, record.worker_id, batch.after)
        return True

    def _batch(self, record: WorkerLike, tailed: Tailed, fd: int, *, final: bool) -> Batch | None:
        """The points and refusals of the next bytes of the file (None: nothing new)."""
        info = os.fstat(fd)
        position = tailed.position
        if position is None or position.inode != info.st_ino or info.st_size < position.offset:
            position = LogPosition(log_id="metrics", inode=info.st_ino, offset=0)
            tailed.skipping = False
        data = os.pread(fd, MAX_READ_BYTES, position.offset)
        if not data:
            return None
        at_eof = position.offset + len(data) >= info.st_size
        found = scan(data, position.offset, skipping=tailed.skipping, final=final and at_eof)
        if found.consumed == 0:
            return None
        points, refused = self._judge(record, found)
        after = LogPosition(position.log_id, position.inode, position.offset + found.consumed)
        first = next((line.offset for line in found.lines), position.offset)
        return Batch(tuple(points), tuple(refused), first, after, found.skipping)

    def _judge(
        self, record: WorkerLike, found: Scan
    ) -> tuple[list[MetricPoint], list[tuple[int, str]]]:
        """The points of the scanned lines, and why each refused line was refused."""
        refused = [(at, "a line longer than the limit") for at in found.overlong]
        points: list[MetricPoint] = []
        for line in found.lines:
            reason = self._refusal(record, line, points)
            if reason is not None:
                refused.append((line.offset, reason))
        refused.sort()
        labelled = [(at, f"METRICS_FILE line at byte {at}: {why}") for at, why in refused]
        return points, labelled

    def _refusal(self, record: WorkerLike, line: Line, points: list[MetricPoint]) -> str | None:
        """Add ``line``'s point to ``points``; why not, if not (None for a blank line too)."""
        try:
            point = parse_metric_line(line.data)
        except MetricLineRefused as exc:
            return safe_text(str(exc))
        if point is None:
            return None
        bucket = f"{record.job}/{record.worker_id}"
        if len(points) >= MAX_POINTS_PER_EVENT or not self.budget.take(
            bucket, 0, self.clock.monotonic()
        ):
            return f"over the rate of {MAX_LINES_PER_S:g} lines a second"
        points.append(point)
        return None

    def _report_dropped(self, record: WorkerLike, tailed: Tailed, *, now: bool) -> None:
        """Send the worker's refused-line count, at most every ``DROPPED_REPORT_EVERY_S``."""
        if not tailed.dropped.count:
            return
        at = self.clock.monotonic()
        if not now and at < tailed.next_dropped_report:
            return
        dropped, tailed.dropped = tailed.dropped, Dropped()
        tailed.next_dropped_report = at + DROPPED_REPORT_EVERY_S
        try:
            self._send(
                EventsDropped(
                    node=self.node,
                    job=record.job,
                    count=dropped.count,
                    reason=dropped.reason,
                    first_event_id=dropped.first_event_id,
                    last_event_id=dropped.last_event_id,
                )
            )
        except Exception:  # a report that cannot leave must not stop the pass
            log.exception("could not send the refused metrics lines of job %s", record.job)


def _event_id(record: WorkerLike, inode: int, offset: int) -> str:
    """The id of the report (or refusal) of the line at ``offset`` of a worker's file."""
    return f"metrics-file-{record.worker_id}-{inode}-{offset}"
