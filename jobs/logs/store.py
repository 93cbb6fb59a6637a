"""A job's whole output: stored once and in order, capped, read back as lines.

::

    append_output(job, node, log_id, offset, text, size, tags)   (job row locked)
        ├── new bytes only      cut [offset, offset+size) against the stream's end and gaps
        ├── store the chunk(s)  LogChunk: job, node, worker, log_id, offset, rank, generation
        ├── cap                 over LOG_MAX_BYTES: drop the oldest chunks, one marker in
        │                       their place ("[… N bytes of older output dropped …]")
        └── broadcast           job.log with the new lines, to the job's page, after commit

    tail_lines / lines_after     chunks in id order, split into lines; a line's cursor is
                                 "<chunk id>-<line index>", opaque to clients
    all_lines                    every line, in order (the log export when the job ends)
    drop_output                  every chunk and stream of the job (log retention)

The only writer of ``LogStream`` and ``LogChunk``.  The caller holds the
job's row lock (``control.reports.handle_report``), so two reports of
one job never interleave here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet, Sum

from jobs.models import Job, LogChunk, LogStream
from utilities.realtime import broadcast_on_commit, job_group

CURSOR_PATTERN = re.compile(r"(\d{1,18})-(\d{1,6})")
MAX_GAPS = 64
"""Missing ranges a stream remembers; beyond that the oldest counts as lost."""

CAP_LOW_WATER = 0.9
"""Dropping for the cap goes down to this share of it, so not every report drops again."""


@dataclass(frozen=True)
class LogTags:
    """Who wrote a piece of output: the worker, and its rank and generation when known."""

    worker_id: str
    rank: int | None = None
    generation: int | None = None


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output, as the API and the page show it."""

    cursor: str
    worker: str
    rank: int | None
    generation: int | None
    node: str
    text: str

    def as_dict(self) -> dict[str, Any]:
        """The line as JSON."""
        return asdict(self)


# --------------------------------------------------------------------------- cursors


def format_cursor(chunk_id: int, index: int) -> str:
    """The cursor of line ``index`` of chunk ``chunk_id``."""
    return f"{chunk_id}-{index}"


def parse_cursor(raw: str) -> tuple[int, int]:
    """(chunk id, line index) of a cursor; ValueError if it is not one."""
    match = CURSOR_PATTERN.fullmatch(raw.strip())
    if match is None:
        raise ValueError(f"not a log cursor: {raw!r}")
    return int(match.group(1)), int(match.group(2))


# --------------------------------------------------------------------------- writing


def _new_ranges(
    start: int, stop: int, end: int, gaps: list[list[int]]
) -> tuple[list[tuple[int, int]], int, list[list[int]]]:
    """The parts of [start, stop) not seen yet, and the stream's new end and gaps."""
    fresh = [(max(a, start), min(b, stop)) for a, b in gaps if max(a, start) < min(b, stop)]
    new_gaps: list[list[int]] = []
    for a, b in gaps:  # a gap minus [start, stop): zero, one or two pieces
        if a < start:
            new_gaps.append([a, min(b, start)])
        if b > stop:
            new_gaps.append([max(a, stop), b])
    if stop > end:
        fresh.append((max(start, end), stop))
        if start > end:
            new_gaps.append([end, start])
    return fresh, max(end, stop), sorted(new_gaps)[-MAX_GAPS:]


def _slice(text: str, size: int, a: int, b: int) -> str:
    """Bytes [a, b) of a chunk of ``size`` bytes as text (whole: the text itself)."""
    if a == 0 and b == size:
        return text
    return text.encode()[a:b].decode(errors="replace")


def append_output(
    *, job: Job, node: str, log_id: str, offset: int, text: str, size: int, tags: LogTags
) -> list[LogChunk]:
    """Store the bytes ``[offset, offset + size)`` of a log file of ``job``, once.

    A range already stored is dropped and an overlapping one trimmed; ranges
    may arrive in any order.  Returns the chunks stored (none for a replay)
    and broadcasts their lines to the job's page after commit.
    """
    stream, _ = LogStream.objects.get_or_create(
        job=job, node=node, log_id=log_id, defaults={"worker_id": tags.worker_id}
    )
    fresh, stream.end, stream.gaps = _new_ranges(offset, offset + size, stream.end, stream.gaps)
    chunks = [
        LogChunk(
            job=job,
            node=node,
            worker_id=tags.worker_id,
            log_id=log_id,
            offset=a,
            rank=tags.rank,
            generation=tags.generation,
            text=_slice(text, size, a - offset, b - offset),
            size=b - a,
        )
        for a, b in fresh
    ]
    chunks = [chunk for chunk in chunks if chunk.size]
    for chunk in chunks:
        chunk.save()
    stream.stored_bytes += sum(chunk.size for chunk in chunks)
    stream.save(update_fields=["end", "gaps", "stored_bytes"])
    if chunks:
        _cap(job, keep_from=chunks[0].pk)
        lines = [line.as_dict() for chunk in chunks for line in chunk_lines(chunk)]
        broadcast_on_commit(
            (job_group(job.pk),), {"type": "job.log", "job": job.pk, "lines": lines}
        )
    return chunks


def _cap(job: Job, *, keep_from: int) -> None:
    """Keep the job's stored output under ``LOG_MAX_BYTES``; never drop chunks from ``keep_from``."""
    limit = int(settings.LOG_MAX_BYTES)
    total = LogStream.objects.filter(job=job).aggregate(total=Sum("stored_bytes"))["total"] or 0
    if total <= limit:
        return
    excess = total - int(limit * CAP_LOW_WATER)
    dropped = 0
    last_id: int | None = None
    per_stream: dict[tuple[str, str], int] = {}
    earlier = 0
    oldest = LogChunk.objects.filter(job=job, id__lt=keep_from).order_by("id")
    for chunk_id, node, log_id, size, offset in oldest.values_list(
        "id", "node", "log_id", "size", "offset"
    ).iterator(chunk_size=500):
        last_id = chunk_id
        if not log_id:  # an earlier marker: its count carries over
            earlier += offset
            continue
        dropped += size
        per_stream[(node, log_id)] = per_stream.get((node, log_id), 0) + size
        if dropped >= excess:
            break
    if last_id is None or not dropped:
        return
    LogChunk.objects.filter(job=job, id__lte=last_id).delete()
    for (node, log_id), size in per_stream.items():
        stream = LogStream.objects.get(job=job, node=node, log_id=log_id)
        stream.stored_bytes -= size
        stream.save(update_fields=["stored_bytes"])
    gone = earlier + dropped
    # The marker takes the id of the newest chunk dropped: it reads first, where they were.
    LogChunk(
        pk=last_id,
        job=job,
        node="",
        worker_id="",
        log_id="",
        offset=gone,
        text=f"[… {gone} bytes of older output dropped (LOG_MAX_BYTES)]\n",
        size=0,
    ).save(force_insert=True)


# --------------------------------------------------------------------------- reading


def chunk_lines(chunk: LogChunk, start: int = 0) -> list[LogLine]:
    """The lines of a chunk from line ``start`` on (a last line without newline counts)."""
    parts = chunk.text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [
        LogLine(
            cursor=format_cursor(chunk.pk, index),
            worker=chunk.worker_id,
            rank=chunk.rank,
            generation=chunk.generation,
            node=chunk.node,
            text=part.removesuffix("\r"),
        )
        for index, part in enumerate(parts)
        if index >= start
    ]


def _chunks(job: Job, worker: str | None) -> QuerySet[LogChunk]:
    chunks = LogChunk.objects.filter(job=job)
    if worker:
        chunks = chunks.filter(Q(worker_id=worker) | Q(log_id=""))  # markers concern everyone
    return chunks


def tail_lines(job: Job, *, count: int, worker: str | None = None) -> list[LogLine]:
    """The last ``count`` lines of the job's output (of one worker's, with ``worker``)."""
    collected: list[LogLine] = []
    for chunk in _chunks(job, worker).order_by("-id").iterator(chunk_size=50):
        collected[:0] = chunk_lines(chunk)
        if len(collected) >= count:
            break
    return collected[-count:] if count else []


def lines_after(
    job: Job, cursor: tuple[int, int], *, limit: int, worker: str | None = None
) -> list[LogLine]:
    """Up to ``limit`` lines that follow ``cursor``, oldest first."""
    chunk_id, index = cursor
    collected: list[LogLine] = []
    for chunk in _chunks(job, worker).filter(id__gte=chunk_id).order_by("id").iterator(50):
        collected += chunk_lines(chunk, index + 1 if chunk.pk == chunk_id else 0)
        if len(collected) >= limit:
            break
    return collected[:limit]


def all_lines(job: Job) -> Iterator[LogLine]:
    """Every line of the job's stored output, in order, read a few chunks at a time."""
    for chunk in LogChunk.objects.filter(job=job).order_by("id").iterator(chunk_size=100):
        yield from chunk_lines(chunk)


def drop_output(job: Job) -> int:
    """Delete the job's whole stored output (chunks and streams); returns the chunks deleted."""
    deleted, _ = LogChunk.objects.filter(job=job).delete()
    LogStream.objects.filter(job=job).delete()
    return deleted


def log_workers(job: Job) -> list[str]:
    """The workers whose output the job has, sorted."""
    return sorted(set(LogStream.objects.filter(job=job).values_list("worker_id", flat=True)))
