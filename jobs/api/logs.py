"""``GET /api/v1/jobs/{id}/logs/``: a job's output as lines, once or followed live.

::

    ?tail=N          the last N lines (default 1000, at most 10000)
    ?since=CURSOR    the lines after CURSOR instead, oldest first, at most N of them
    ?worker=W        only worker W's lines (and the marker of dropped output)
    ?follow=1        Server-Sent Events: the lines above, then each new line as it is
                     stored (the database is polled every 0.5 s), a comment every 15 s
                     so proxies keep the connection, and ``event: end`` once the job is
                     over and nothing is left to send

The stream is an async iterator, so daphne sends each event as it comes and a
client that goes away cancels it (Django's ASGI handler cancels the response).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from channels.db import database_sync_to_async
from django.http import StreamingHttpResponse
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer

from jobs.choices import TERMINAL_STATES
from jobs.logs.store import LogLine, format_cursor, lines_after, parse_cursor, tail_lines
from jobs.models import Job

DEFAULT_TAIL = 1000
MAX_TAIL = 10000
POLL_SECONDS = 0.5
HEARTBEAT_SECONDS = 15.0
LAST_LINE = 999_999
"""A line index past every line of a chunk (a chunk has at most 65537 lines)."""
START_CURSOR = format_cursor(0, 0)
"""Before every line: ``since`` from here reads the log from its start."""


Poll = Callable[[tuple[int, int]], Awaitable[tuple[list[LogLine], bool]]]
"""Reads the lines after a cursor, and whether the job is over (an async call)."""


class EventStreamRenderer(BaseRenderer):
    """Lets a client that asks for ``text/event-stream`` (an EventSource) in."""

    media_type = "text/event-stream"
    format = "event-stream"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Errors go out as one JSON ``error`` event."""
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()


@dataclass(frozen=True)
class LogQuery:
    """The checked query parameters of a logs request."""

    tail: int
    since: tuple[int, int] | None
    worker: str | None
    follow: bool


def check_log_query(params: Any) -> LogQuery:
    """Parse the query; a bad parameter is a 400 that names it."""
    raw_tail = params.get("tail")
    tail = DEFAULT_TAIL
    if raw_tail not in (None, ""):
        try:
            tail = int(raw_tail)
        except ValueError:
            raise ValidationError({"tail": ["Must be an integer."]}) from None
        if not 0 <= tail <= MAX_TAIL:
            raise ValidationError({"tail": [f"Must be between 0 and {MAX_TAIL}."]})
    since = None
    if raw_since := params.get("since"):
        try:
            since = parse_cursor(raw_since)
        except ValueError:
            raise ValidationError({"since": ["Not a cursor from this API."]}) from None
    worker = params.get("worker") or None
    if worker is not None and (len(worker) > 128 or not worker.isprintable()):
        raise ValidationError({"worker": ["Not a worker id."]})
    raw_follow = (params.get("follow") or "0").lower()
    if raw_follow not in ("0", "1", "true", "false"):
        raise ValidationError({"follow": ["Must be 0 or 1."]})
    return LogQuery(tail=tail, since=since, worker=worker, follow=raw_follow in ("1", "true"))


def read_lines(job: Job, query: LogQuery) -> tuple[list[LogLine], bool]:
    """The lines the query asks for, and whether the job is over with nothing more to read."""
    terminal = job.state in TERMINAL_STATES
    if query.since is None:
        return tail_lines(job, count=query.tail, worker=query.worker), terminal
    lines = lines_after(job, query.since, limit=query.tail + 1, worker=query.worker)
    return lines[: query.tail], terminal and len(lines) <= query.tail


def log_page(job: Job, query: LogQuery) -> dict[str, Any]:
    """The JSON answer: lines, the cursor to go on from, and ``done``."""
    lines, done = read_lines(job, query)
    if lines:
        cursor = lines[-1].cursor
    elif query.since is not None:
        cursor = format_cursor(*query.since)
    else:
        cursor = START_CURSOR
    return {"lines": [line.as_dict() for line in lines], "cursor": cursor, "done": done}


def poll_job(
    job_id: int, cursor: tuple[int, int], worker: str | None
) -> tuple[list[LogLine], bool]:
    """New lines after ``cursor`` and whether the job is over (read again from the database)."""
    job = Job.objects.get(pk=job_id)
    terminal = job.state in TERMINAL_STATES  # read first: lines stored after it come next time
    lines = lines_after(job, cursor, limit=MAX_TAIL + 1, worker=worker)
    return lines[:MAX_TAIL], terminal and len(lines) <= MAX_TAIL


def _event(line: LogLine) -> str:
    return f"id: {line.cursor}\ndata: {json.dumps(line.as_dict())}\n\n"


async def follow_events(
    first: list[LogLine],
    cursor: tuple[int, int],
    poll: Poll,
    *,
    poll_seconds: float = POLL_SECONDS,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> AsyncIterator[str]:
    """The SSE stream: ``first``, then what ``poll`` finds after ``cursor``, until the end."""
    for line in first:
        yield _event(line)
    if first:
        cursor = parse_cursor(first[-1].cursor)
    quiet_since = monotonic()
    while True:
        lines, done = await poll(cursor)
        for line in lines:
            yield _event(line)
        if lines:
            cursor = parse_cursor(lines[-1].cursor)
            quiet_since = monotonic()
        if done:
            yield f"event: end\ndata: {json.dumps({'cursor': format_cursor(*cursor)})}\n\n"
            return
        if monotonic() - quiet_since >= heartbeat_seconds:
            yield ": heartbeat\n\n"
            quiet_since = monotonic()
        await asyncio.sleep(poll_seconds)


def follow_response(job: Job, query: LogQuery) -> StreamingHttpResponse:
    """The ``follow=1`` answer: an event stream that ends with the job."""
    if query.since is None:
        first = tail_lines(job, count=query.tail, worker=query.worker)
        start = parse_cursor(first[-1].cursor) if first else (0, 0)
        if not first:
            # Nothing yet: follow from the newest chunk there is (of other workers, say).
            newest = job.log_chunks.order_by("-id").values_list("id", flat=True).first()
            start = (newest, LAST_LINE) if newest else (0, 0)
    else:
        first, start = [], query.since
    job_id, worker = job.pk, query.worker

    def read(cursor: tuple[int, int]) -> tuple[list[LogLine], bool]:
        return poll_job(job_id, cursor, worker)

    # database_sync_to_async: the polling thread's stale connections are closed, as in consumers.
    poll = cast(Poll, database_sync_to_async(read))
    events = follow_events(first, start, poll)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response
