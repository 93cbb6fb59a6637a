"""A Server-Sent Events parser (the wire format of ``logs/?follow=1``), pure and incremental.

::

    id: 12:0            ┐
    data: {"text": ...} ├─► Event(event="message", data='{"text": ...}', id="12:0")
                        ┘   (a blank line ends an event)
    : heartbeat             a comment: skipped
    event: end
    data: {"cursor": ...} ─► Event(event="end", ...)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """One dispatched event."""

    event: str
    data: str
    id: str | None


def parse_events(lines: Iterable[str]) -> Iterator[Event]:
    """The events of a stream given line by line (line endings already stripped or not)."""
    event = ""
    data: list[str] = []
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data or event:
                yield Event(event=event or "message", data="\n".join(data), id=last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id" and "\0" not in value:
            last_id = value
    if data or event:  # a stream cut before its blank line still delivers what it had
        yield Event(event=event or "message", data="\n".join(data), id=last_id)
