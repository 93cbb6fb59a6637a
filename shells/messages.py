"""What a shell's WebSocket client may send, parsed strictly (pure: no Django, no I/O).

Text frames are JSON objects with a ``type``::

    {"type": "open", "worker": "w0", "argv": ["sh", "-c", "id"], "term": "xterm",
     "rows": 24, "cols": 80}                                 first, once
    {"type": "resize", "rows": 40, "cols": 120}
    {"type": "eof"}                                           end of input (Ctrl-D at a line start)
    {"type": "close"}                                         end the shell now

Binary frames are the shell's input, bytes as typed (Ctrl-C is the byte 0x03).  Anything
else is refused with the field at fault (``MessageError``), and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workers.protocol import ProtocolError, check_shell_argv, check_window

DEFAULT_TERM = "xterm-256color"


class MessageError(ValueError):
    """A client message that cannot be used: the ``field`` at fault and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Message:
    """One parsed text frame."""

    type: str
    worker: str | None = None
    argv: list[str] = field(default_factory=list)
    term: str = DEFAULT_TERM
    rows: int = 24
    cols: int = 80


TYPES = ("open", "resize", "eof", "close")


def parse_message(text: str, max_chars: int) -> Message:
    """The ``Message`` a text frame holds, or ``MessageError`` naming the field."""
    if len(text) > max_chars:
        raise MessageError("message", f"a text frame may hold at most {max_chars} characters")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise MessageError("message", "a text frame must be a JSON object") from None
    if not isinstance(data, dict):
        raise MessageError("message", "a text frame must be a JSON object")
    kind = data.get("type")
    if kind not in TYPES:
        raise MessageError("type", f"type must be one of {', '.join(TYPES)}")
    if kind in ("eof", "close"):
        return Message(type=kind)
    rows, cols = _window(data)
    if kind == "resize":
        return Message(type=kind, rows=rows, cols=cols)
    return Message(
        type=kind,
        worker=_optional_text(data, "worker"),
        argv=_argv(data.get("argv", [])),
        term=_optional_text(data, "term") or DEFAULT_TERM,
        rows=rows,
        cols=cols,
    )


def _window(data: dict[str, Any]) -> tuple[int, int]:
    values = []
    for name in ("rows", "cols"):
        value = data.get(name, 24 if name == "rows" else 80)
        try:
            check_window(value, name)
        except ProtocolError as exc:
            raise MessageError(name, str(exc)) from None
        values.append(value)
    return values[0], values[1]


def _optional_text(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 128:
        raise MessageError(name, f"{name} must be a non-empty string of at most 128 characters")
    return value


def _argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise MessageError("argv", "argv must be a list of strings")
    try:
        check_shell_argv(tuple(value), "argv")
    except ProtocolError as exc:
        raise MessageError("argv", str(exc)) from None
    return list(value)
