"""JSON text parsed within bounds, or refused with a message that names the field.

Python's ``json`` parser recurses once per nested array or object: ``"[" * 5000``
raises ``RecursionError`` (a 500), and a document a few hundred levels deep
parses but crashes whatever walks it next (``json.dumps``, ``deepcopy``, a
serializer). So the brackets are counted first, outside strings and without
recursion, and a document deeper than ``max_depth`` is refused before the
parser sees it::

    {"name": "a", "args": {"x": [[[[ ... ]]]]}}
     └ depth 1     └ 2     └ 3 ...           refused past max_depth,
                                             blamed on "args"

Strings must not hold NUL (PostgreSQL refuses it in text: a 500 later).
Numbers must be finite and fit a 64-bit column: ``1e400`` (inf), ``NaN`` and a
5,000-digit integer are refused too, since no field of ours can hold them.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 32
"""Nesting allowed by default: far more than any of our documents needs."""

INT_LIMIT = 2**63
"""Integers must lie in [-INT_LIMIT, INT_LIMIT): what a bigint column holds."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_KEY_COLON = re.compile(r"\s*:")
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # an unescaped \u0000
_LONG_DIGITS = re.compile(r"\d{19}")  # the only integers that can be out of range


class JsonRefused(ValueError):
    """A document refused: not JSON, too deep, or a number out of range.

    ``field`` is the top-level key of the object under which the problem lies
    (None when it is the document itself).
    """

    def __init__(self, message: str, field: str | None = None, token: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.token = token  # the offending number as written, to find its field by


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (0 for a scalar); never recurses."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    steps = (1 if c in "[{" else -1 for c in brackets)
    return max(accumulate(steps, initial=0))


def top_level_field(text: str, *, max_depth: int | None = None, offset: int = -1) -> str | None:
    """The top-level key under which ``text`` first nests past ``max_depth``, or that holds
    the character at ``offset``; None when the document itself is to blame.
    """
    depth = 0
    key: str | None = None
    for token in _TOKEN.finditer(text):
        if 0 <= offset < token.end():
            return key if depth >= 1 else None
        mark = token.group()
        if mark[0] == '"':
            if depth == 1 and _KEY_COLON.match(text, token.end()):
                key = str(json.loads(mark))
        elif mark in "[{":
            depth += 1
            if max_depth is not None and depth > max_depth:
                return key
        else:
            depth -= 1
    return None


def _finite_float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise JsonRefused(f"The number {raw[:20]} is out of range.", token=raw)
    return value


def _bounded_int(raw: str) -> int:
    if len(raw.lstrip("-")) > 19:  # checked before int(): huge digit strings are slow
        raise JsonRefused(f"The integer {raw[:20]}… is out of range.", token=raw)
    value = int(raw)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise JsonRefused(f"The integer {raw} is out of range.", token=raw)
    return value


def _refuse_constant(raw: str) -> Any:
    raise JsonRefused(f"{raw} is not a JSON number.", token=raw)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON ``text``; raise ``JsonRefused`` for bad JSON, deep nesting or wild numbers."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise JsonRefused("The JSON is not UTF-8 text.") from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JsonRefused(
            f"Nested {depth} levels deep; at most {max_depth} are allowed.",
            top_level_field(text, max_depth=max_depth),
        )
    if nul := _NUL_ESCAPE.search(text):  # PostgreSQL text cannot hold NUL: refuse it here
        raise JsonRefused(
            "Text may not contain NUL (\\u0000) characters.",
            top_level_field(text, offset=nul.end() - 1),
        )
    try:
        return json.loads(
            text,
            parse_float=_finite_float,
            parse_int=_bounded_int if _LONG_DIGITS.search(text) else int,
            parse_constant=_refuse_constant,
        )
    except JsonRefused as exc:  # a number: blame the field where it is first written
        field = top_level_field(text, offset=text.find(exc.token)) if exc.token else None
        raise JsonRefused(exc.message, field) from None
    except json.JSONDecodeError as exc:
        raise JsonRefused(f"Not valid JSON: {exc.msg} (line {exc.lineno}).") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: cannot happen past the count
        raise JsonRefused(f"Not valid JSON: {exc}.") from None
