"""A job's event stream as an agent reads it: untrusted input, checked and bounded.

The elastic runtime runs inside the tenant's program, with the job's own
Redis user, and appends its events to ``edl:<job>:events``
(``workers.elastic.control.publish``; each kind is declared in ``workers.runtime_events``)::

    tenant program ──XADD {kind, data: JSON}──▶ edl:<job>:events ──XREAD──▶ agent ──▶ portal

Anything the program can do, it can do to that stream: write bytes that are
not UTF-8, JSON that is not an object, strings with lone surrogates (valid
JSON, ``"\\ud800"``, but no UTF-8 encoder takes them), nesting deep enough to
exhaust the parser's recursion, entries of many megabytes, ids far in the
future, thousands of entries a second.  This module is the one gate every
entry passes before the agent makes a report of it:

* ``decode_entry``: the entry's id, size, fields, encoding, JSON shape and
  depth; every string of it must encode (``EventRefused`` otherwise, with a
  short reason that is itself safe to send);
* ``EventBudget``: how many events and bytes a job may have read per second
  (a token bucket per job; entries over it are dropped and counted).

Which fields of an event the agent reads, and how, is the event's declaration
(``workers.runtime_events``); what an event *says* (a worker left, a worker is
slow) is judged elsewhere, against what the agent sees itself (``workers.agent.events``).

No Django or Celery; nothing here talks to Redis.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.runtime_events import ENTRY_FIELDS, EVENT_KINDS
from workers.schema import ProtocolError, check_text

MAX_EVENT_BYTES = 1 << 20
"""The most bytes one entry (its field names and values) may hold.

The largest event the runtime writes is a ``metrics`` event of 200 points of
32 metrics each (about 600 KB at the longest names)."""

MAX_DEPTH = 6
"""How deeply an event's JSON may nest (the runtime's deepest is a metric point's values: 3)."""

MAX_ID_SKEW_MS = 60_000
"""How far past the agent's clock an entry id's time may lie (a program may choose its ids)."""

_ENTRY_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
REASON_CHARS = 200


class EventRefused(ProtocolError):
    """An entry of a job's event stream that the agent drops; the text says why (ASCII-safe)."""


def safe_text(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters, every character one that UTF-8 encodes.

    Reasons quote what a program wrote; a lone surrogate in them must not make
    the reason itself unsendable.
    """
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def check_entry_id(entry_id: str, *, now_s: float) -> None:
    """Refuse an id that is not ``<ms>-<seq>`` or that lies in the future.

    Redis makes the ids, unless the writer gives its own: an id far in the
    future would make every later event of the job look old to the portal.
    """
    match = _ENTRY_ID.fullmatch(entry_id)
    if match is None:
        raise EventRefused(f"entry id {safe_text(repr(entry_id), 60)} is not <ms>-<seq>")
    if int(match.group(1)) > now_s * 1000 + MAX_ID_SKEW_MS:
        raise EventRefused(f"entry id {entry_id[:60]} lies in the future")


def decode_entry(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The event of one stream entry (``{"kind": ..., **data}``), or ``EventRefused``.

    ``fields`` are the entry's raw bytes, as Redis holds them.
    """
    size = entry_size(fields)
    if size > MAX_EVENT_BYTES:
        raise EventRefused(f"entry of {size} bytes is over the limit of {MAX_EVENT_BYTES}")
    try:
        named = {key.decode("utf-8"): value.decode("utf-8") for key, value in fields.items()}
    except UnicodeDecodeError:
        raise EventRefused("entry is not UTF-8 text") from None
    if set(named) != ENTRY_FIELDS:
        shown = safe_text(", ".join(sorted(named)), 100)
        raise EventRefused(f"entry must have the fields kind and data, not {shown}")
    kind = named["kind"]
    if kind not in EVENT_KINDS:  # the kinds the runtime writes
        raise EventRefused(f"unknown event kind {safe_text(repr(kind), 80)}")
    try:
        body = json.loads(named["data"])
    except RecursionError:
        raise EventRefused(f"{kind} event nests too deeply") from None
    except ValueError as exc:
        raise EventRefused(f"{kind} event's data is not JSON: {safe_text(str(exc), 80)}") from None
    if not isinstance(body, dict):
        raise EventRefused(f"{kind} event's data is not a JSON object")
    if "kind" in body:
        raise EventRefused(f"{kind} event's data names a kind of its own")
    _check_value(body, f"{kind} event", 1)
    body["kind"] = kind
    return body


def _check_value(value: Any, path: str, depth: int) -> None:
    """Refuse nesting past ``MAX_DEPTH`` and any string (key or value) that does not encode."""
    if isinstance(value, str):
        _encodes(value, path)
        return
    if not isinstance(value, dict | list):
        return
    if depth > MAX_DEPTH:
        raise EventRefused(f"{path} nests deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for key, item in value.items():
            _encodes(key, f"{path} key")
            _check_value(item, path, depth + 1)
    else:
        for item in value:
            _check_value(item, path, depth + 1)


def _encodes(text: str, path: str) -> None:
    try:
        check_text(text, path)
    except ProtocolError as exc:
        raise EventRefused(str(exc)) from None


@dataclass
class _Bucket:
    events: float
    bytes: float
    at: float


@dataclass
class EventBudget:
    """How much of each job's stream an agent reads: a token bucket of events and bytes per job.

    A job gets ``events_per_s`` events and ``bytes_per_s`` bytes a second,
    with bursts up to ``burst_events`` and ``burst_bytes``; what goes over is
    dropped (and counted by the caller).  The runtime writes a few events a
    second (progress every 0.5 s, metrics every second, the rest rarely), so
    the defaults never touch a program that only uses the runtime.
    """

    events_per_s: float = 20.0
    burst_events: float = 400.0
    bytes_per_s: float = 1024.0 * 1024.0
    burst_bytes: float = 16.0 * 1024.0 * 1024.0
    _jobs: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, job: str, size: int, now: float) -> bool:
        """Whether ``job`` may have one more event of ``size`` bytes at monotonic time ``now``."""
        bucket = self._jobs.get(job)
        if bucket is None:
            bucket = self._jobs[job] = _Bucket(self.burst_events, self.burst_bytes, now)
        elapsed = max(0.0, now - bucket.at)
        bucket.at = now
        bucket.events = min(self.burst_events, bucket.events + elapsed * self.events_per_s)
        bucket.bytes = min(self.burst_bytes, bucket.bytes + elapsed * self.bytes_per_s)
        if bucket.events < 1 or bucket.bytes < size:
            return False
        bucket.events -= 1
        bucket.bytes -= size
        return True

    def forget(self, job: str) -> None:
        """Drop the job's bucket (it ended here)."""
        self._jobs.pop(job, None)


def entry_size(fields: Mapping[bytes, bytes]) -> int:
    """The bytes of one entry as ``decode_entry`` counts them."""
    return sum(len(key) + len(value) for key, value in fields.items())
