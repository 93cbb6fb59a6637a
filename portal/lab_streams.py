"""The portal's end of a session lab's Redis streams (``workers.lab_protocol``), and who may
reach which lab.

``lab_target`` is asked on every request and WebSocket: the session must be one the user
may open (``jobs.sessions.lab_job``: 404 otherwise) and must run (404 too: a lab that does
not run has nothing to show); it names the node whose agent relays the lab (its rank-0
worker's) and records the activity.  ``Exchange`` is one request's or WebSocket's
conversation with that agent.  Nothing here is kept between requests: a portal process
that restarts loses only the exchanges in flight, which the browser retries.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.http import Http404
from django.utils import timezone

from jobs.agent_commands import runtime_job_name
from jobs.choices import JobState
from jobs.models import JobGpu
from jobs.sessions import lab_job, note_activity
from workers.lab_protocol import (
    LAB_STREAM_MAXLEN,
    LAB_STREAM_TTL_S,
    Entry,
    LabFrameError,
    lab_base_url,
    lab_in_key,
    lab_out_key,
    parse_out,
)
from workers.protocol import shell_entries

RUNNING = (JobState.RUNNING, JobState.SCALING)
NOTE_EVERY = timedelta(seconds=10)
"""A request notes the session's activity when the last note is older than this."""


@dataclass(frozen=True)
class LabTarget:
    """Where a session's lab is served: its node, its runtime name, its base URL."""

    job_id: int
    node: str
    job: str
    base_url: str


def lab_target(user: Any, job_id: int) -> LabTarget:
    """The lab of session ``job_id`` for ``user``, its activity noted; ``Http404`` when the
    user may not open it, or it does not run (no worker placed)."""
    job = lab_job(user, job_id)
    if job.state not in RUNNING:
        raise Http404(f"Session {job_id} does not run.")
    slot = (
        JobGpu.objects.filter(job_id=job.pk)
        .select_related("gpu__server")
        .order_by("rank")
        .only("gpu__server__node")
        .first()
    )
    if slot is None:
        raise Http404(f"Session {job_id} does not run.")
    now = timezone.now()
    last = job.last_activity_at
    if last is None or now - last >= NOTE_EVERY:  # a page's hundred files: one write
        note_activity(job.pk, now)
    return LabTarget(
        job_id=job.pk,
        node=slot.gpu.server.node,
        job=runtime_job_name(job.pk),
        base_url=lab_base_url(job.pk),
    )


class Exchange:
    """One exchange with the agent: entries out on the lab's ``in`` stream, its answer read
    from its own ``out`` stream."""

    def __init__(self, target: LabTarget) -> None:
        self.target = target
        self.id = secrets.token_hex(16)
        self.in_key = lab_in_key(target.node, target.job)
        self.out_key = lab_out_key(target.node, target.job, self.id)
        self.client = aioredis.Redis.from_url(settings.REDIS_URL)
        self.last = "0-0"

    async def send(self, fields: Mapping[str, bytes | str]) -> None:
        """One entry toward the lab (this exchange's)."""
        entry: dict[Any, Any] = {"x": self.id, **fields}
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(self.in_key, entry, maxlen=LAB_STREAM_MAXLEN, approximate=True)
            pipe.expire(self.in_key, LAB_STREAM_TTL_S)
            await pipe.execute()

    async def receive(self, wait_s: float) -> list[Entry]:
        """The answer's next entries, waiting up to ``wait_s``; a malformed one is skipped."""
        deadline = time.monotonic() + wait_s
        while True:
            block = max(1, min(1000, int((deadline - time.monotonic()) * 1000)))
            answer = await self.client.xread({self.out_key: self.last}, count=100, block=block)
            entries = shell_entries(answer)
            if entries:
                self.last = entries[-1][0]
                out = []
                for _id, fields in entries:
                    try:
                        out.append(parse_out(fields))
                    except LabFrameError:
                        continue
                return out
            if time.monotonic() >= deadline:
                return []

    async def close(self) -> None:
        """Forget the answer's stream and drop the connection."""
        try:
            await self.client.delete(self.out_key)
        finally:
            await self.client.aclose()
