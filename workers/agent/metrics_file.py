"""The lines of a torchrun program's ``METRICS_FILE``, as pure rules: cut, parse, refuse.

A ``torchrun`` program has no runtime to call ``ctx.log_metrics``; it appends
one JSON object a line to the file its environment names in ``METRICS_FILE``::

    {"step": 10, "loss": 0.5, "acc": 0.9}

The file is the tenant's to write, so every byte of it is hostile input.
This module decides what a run of bytes read from it holds (``scan``) and
what one line means (``parse_metric_line``); reading the file and sending
the points is ``workers.agent.metrics_tail``'s.

* a line is at most ``MAX_LINE_BYTES`` (without its newline); a longer one
  is skipped to its newline, however many reads that takes, and counted once;
* a line is UTF-8 JSON: an object with an integer ``step`` (0 to
  ``MAX_STEP``) and 1 to 32 metrics, each named as ``ctx.log_metrics``
  names them (``workers.outputs.METRIC_NAME``) with a finite number
  (``NaN``, ``Infinity``, booleans, strings and numbers too large for a
  float are refused);
* a blank line is nothing.

No I/O, no Django, no Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from workers.job_events import safe_text
from workers.protocol import MetricPoint, ProtocolError

METRICS_FILE_NAME = "metrics.jsonl"
"""The name of the file in a worker's scratch directory that ``METRICS_FILE`` names."""

MAX_LINE_BYTES = 4096
"""The longest line read (32 metrics with long names and values fit in half of it)."""

MAX_STEP = 2**63 - 1
"""The largest step stored (the database keeps a step in a signed 64-bit column)."""

REASON_CHARS = 120
"""The most characters of a refusal's reason (it quotes what the program wrote)."""


class MetricLineRefused(ValueError):
    """A line of a metrics file that is not a metric point; the message says why (safe text)."""


@dataclass(frozen=True)
class Line:
    """One whole line of the file: where it starts (byte offset) and its bytes (no newline)."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class Scan:
    """What ``scan`` found in a run of bytes read from a metrics file.

    ``consumed`` bytes of the run are done with (the offset moves past them);
    a partial last line is not, unless the read was ``final``.  ``overlong``
    holds the offsets of the lines over ``MAX_LINE_BYTES`` that start in this
    run; ``skipping`` says the run ends inside one (the next read skips on to
    its newline).
    """

    lines: tuple[Line, ...]
    overlong: tuple[int, ...]
    consumed: int
    skipping: bool


def scan(
    data: bytes, start: int, *, skipping: bool, final: bool, max_line: int = MAX_LINE_BYTES
) -> Scan:
    """Cut ``data`` (read from byte ``start`` of the file) into whole lines.

    ``skipping``: the previous read ended inside an overlong line, so
    everything up to the first newline is still part of it.  ``final``: the
    writer has exited, so a last line without its newline counts too.
    """
    pos = 0
    if skipping:
        newline = data.find(b"\n")
        if newline < 0:
            return Scan(lines=(), overlong=(), consumed=len(data), skipping=True)
        pos = newline + 1
    lines: list[Line] = []
    overlong: list[int] = []
    while pos < len(data):
        newline = data.find(b"\n", pos, pos + max_line + 1)
        if newline >= 0:
            lines.append(Line(start + pos, data[pos:newline]))
            pos = newline + 1
            continue
        if len(data) - pos > max_line:
            overlong.append(start + pos)
            newline = data.find(b"\n", pos + max_line + 1)
            if newline < 0:
                return Scan(tuple(lines), tuple(overlong), len(data), skipping=True)
            pos = newline + 1
            continue
        if final:
            lines.append(Line(start + pos, data[pos:]))
            pos = len(data)
        break
    return Scan(tuple(lines), tuple(overlong), pos, skipping=False)


def parse_metric_line(line: bytes) -> MetricPoint | None:
    """The point one line holds; None for a blank line; ``MetricLineRefused`` saying why not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise MetricLineRefused("not UTF-8 text") from None
    if not text.strip():
        return None
    try:
        body = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise MetricLineRefused("nests too deeply") from None
    except ValueError as exc:
        raise MetricLineRefused(f"not JSON: {safe_text(str(exc), REASON_CHARS)}") from None
    if not isinstance(body, dict):
        raise MetricLineRefused("not a JSON object")
    step = body.pop("step", None)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise MetricLineRefused(f"step must be an integer from 0 to {MAX_STEP}")
    try:
        return MetricPoint(step=step, values=body)
    except (ProtocolError, OverflowError) as exc:
        raise MetricLineRefused(safe_text(str(exc), REASON_CHARS)) from None


def _refuse_constant(name: str) -> float:
    """``json``'s hook for ``NaN``, ``Infinity`` and ``-Infinity``: none is a metric value."""
    raise ValueError(f"{name} is not a finite number")
