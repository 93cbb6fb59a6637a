"""How a session's JupyterLab travels between the portal and the node agent (pure framing).

::

    browser ──HTTP / WebSocket──> portal (labs.views, labs.consumers)
        │ XADD agent:<node>:lab:<job>:in       one stream per session, every exchange's entries
        ▼
    agent (workers.agent.lab_relay) ──HTTP / WebSocket over lab.sock──> Jupyter in the sandbox
        │ XADD agent:<node>:lab:<job>:out:<x>  one stream per exchange, read by the portal
        ▼
    portal ──> browser

An *exchange* is one HTTP request and its response, or one WebSocket, named by ``x``:
32 hexadecimal digits the portal draws at random.  Every entry carries ``t``, its type:

====  =========================  ============================================================
t     to the agent (``in``)      to the portal (``out:<x>``)
====  =========================  ============================================================
h     HTTP request head:         HTTP response head: ``s`` status, ``hd`` headers
      ``m`` method, ``p`` path,
      ``hd`` headers
b     a piece of the request     a piece of the response body (``d``)
      body (``d``)
e     end of the request body    end of the response
o     open a WebSocket: ``p``,   the WebSocket is open (``sp``: the subprotocol chosen)
      ``hd``
w     a message: ``d``, ``k``    a message: ``d``, ``k`` (``t`` text, ``b`` binary)
      (``t`` text, ``b`` binary)
c     the client left / closes   the WebSocket closed (``cc`` code)
      (``cc`` code)
p     the portal still serves
      this WebSocket
f                                the exchange failed (``r`` why: Jupyter unreachable...)
====  =========================  ============================================================

A message longer than ``MAX_CHUNK`` travels in pieces: every ``w`` but the last of one
message carries ``n`` = ``1`` (more follows); the receiver joins them, up to
``MAX_MESSAGE_BYTES``.  A WebSocket the portal has not mentioned (``p``) for
``WS_SILENT_S`` is closed by the relay: the portal process that served it has gone
(a restart), and the browser has reconnected through another.

``hd`` is a JSON list of ``[name, value]`` pairs.  Every value is bounded (``MAX_CHUNK``,
``MAX_HEADERS_BYTES``, ``MAX_PATH_CHARS``); a malformed entry is a ``LabFrameError`` and is
dropped, never raised through a relay's loop.  Every write trims its stream
(``LAB_STREAM_MAXLEN``) and renews its expiry (``LAB_STREAM_TTL_S``), as shells' do, so an
abandoned exchange's keys go away by themselves.

What Jupyter may see of a request (``forwarded_request_headers``) and what the browser may
see of a response (``returned_response_headers``) are decided here, once: the portal's
cookies, its ``Authorization`` and CSRF headers never reach Jupyter; Jupyter's cookies never
reach the browser; the relay adds Jupyter's token itself, and ``TokenScrubber`` removes it
from any response body that would carry it (JupyterLab writes it into its page).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXCHANGE_ID = re.compile(r"[0-9a-f]{32}")
MAX_CHUNK = 256 * 1024
"""The most bytes one ``d`` carries, either way."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest WebSocket message either way (a kernel's output of a big plot)."""
WS_PING_EVERY_S = 20.0
WS_SILENT_S = 90.0
MAX_HEADERS = 100
MAX_HEADERS_BYTES = 32 * 1024
MAX_PATH_CHARS = 8192
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body a lab takes (JupyterLab uploads big files in 1 MiB pieces)."""
LAB_STREAM_MAXLEN = 2000
"""Entries a lab's stream keeps (older ones are trimmed)."""
LAB_STREAM_TTL_S = 600
HEAD_WAIT_S = 60.0
"""How long the portal waits for the head of a request's answer.  A relay that starts
serves the entries of its ``in`` stream this recent too: a request the portal sent while
the lab was starting, before its relay read the stream, is still awaited."""
"""A lab's streams expire this long after their last entry."""
ACTIVITY_EVERY_S = 30.0
"""How often the relay reads Jupyter's ``/api/status`` and reports kernel activity."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
TOKEN_HEADER = "Authorization"

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]{0,16384}")

DROPPED_REQUEST_HEADERS = frozenset(
    {
        # the portal's identity: never Jupyter's business
        "cookie",
        "authorization",
        "x-csrftoken",
        "x-xsrftoken",
        "proxy-authorization",
        # checked by the portal, then meaningless behind it (Jupyter would compare them
        # with a Host it never sees)
        "origin",
        "referer",
        "host",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        # hop by hop, or the relay's own (it sends the body it counted, uncompressed
        # responses so that the token scrubber can read them)
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "accept-encoding",
        "expect",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
    }
)
DROPPED_RESPONSE_HEADERS = frozenset(
    {
        "set-cookie",  # Jupyter's cookies would live on the portal's origin
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",  # the scrubbed body may be shorter; the portal streams it
        "content-encoding",
        "trailer",
        "upgrade",
        "server",
        "www-authenticate",
    }
)


class LabFrameError(ValueError):
    """An entry of a lab's stream that breaks the framing (dropped, and counted)."""


def lab_in_key(node: str, job: str) -> str:
    """The stream the agent reads: every exchange's entries toward one session's Jupyter."""
    return f"agent:{node}:lab:{job}:in"


def lab_out_key(node: str, job: str, exchange: str) -> str:
    """The stream one exchange's answer comes back on (the portal reads it)."""
    return f"agent:{node}:lab:{job}:out:{exchange}"


def lab_base_url(job_id: int) -> str:
    """Where the portal serves session ``job_id``'s lab (Jupyter's ``base_url``)."""
    return f"/sessions/{job_id}/lab/"


RUNTIME_JOB = re.compile(r"job-([1-9][0-9]{0,17})")
"""A job's runtime name (``jobs.agent_commands.runtime_job_name``): ``job-<pk>``."""


def base_url_of(job: str) -> str:
    """The lab's ``base_url`` for the runtime job name ``job`` (``job-42``); ValueError if
    the name is not a portal job's."""
    match = RUNTIME_JOB.fullmatch(job)
    if match is None:
        raise ValueError(f"{job!r} is not a portal job's runtime name (job-<id>)")
    return lab_base_url(int(match.group(1)))


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Entry:
    """One checked entry of a lab's stream (either direction)."""

    type: str
    exchange: str
    method: str = ""
    path: str = ""
    headers: Headers = ()
    data: bytes = b""
    kind: str = ""
    status: int = 0
    code: int = 0
    subprotocol: str = ""
    reason: str = ""
    more: bool = False


def encode_headers(headers: Iterable[tuple[str, str]]) -> str:
    """``hd``: the pairs as JSON (checked on the way out too: a bad one is an error here)."""
    pairs = check_headers([[name, value] for name, value in headers])
    return json.dumps([list(pair) for pair in pairs])


def check_headers(raw: Any) -> Headers:
    """Parsed ``hd`` pairs: names as HTTP allows, values without control characters,
    at most ``MAX_HEADERS`` and ``MAX_HEADERS_BYTES`` in all."""
    if not isinstance(raw, list) or len(raw) > MAX_HEADERS:
        raise LabFrameError(f"headers must be a list of at most {MAX_HEADERS} pairs")
    total = 0
    out: list[tuple[str, str]] = []
    for pair in raw:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise LabFrameError("a header must be a [name, value] pair")
        name, value = pair
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise LabFrameError(f"bad header name {str(name)[:40]!r}")
        if not isinstance(value, str) or not HEADER_VALUE.fullmatch(value):
            raise LabFrameError(f"bad value of header {name}")
        total += len(name) + len(value)
        out.append((name, value))
    if total > MAX_HEADERS_BYTES:
        raise LabFrameError(f"headers over {MAX_HEADERS_BYTES} bytes")
    return tuple(out)


def check_path(path: str, base_url: str) -> str:
    """A request target below ``base_url``: no control character, no way out of it."""
    if not path.startswith(base_url) or len(path) > MAX_PATH_CHARS:
        raise LabFrameError(f"the path must start with {base_url} (at most {MAX_PATH_CHARS})")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in path):
        raise LabFrameError("the path holds a space or a control character")
    if "/../" in path.split("?", 1)[0] + "/" or "\\" in path:
        raise LabFrameError("the path holds '..' or a backslash")
    return path


def _text(fields: Mapping[bytes, bytes], name: bytes, limit: int) -> str:
    raw = fields.get(name, b"")
    if len(raw) > limit:
        raise LabFrameError(f"{name.decode()} over {limit} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise LabFrameError(f"{name.decode()} is not UTF-8") from None


def _int(fields: Mapping[bytes, bytes], name: bytes, low: int, high: int) -> int:
    try:
        value = int(fields.get(name, b""))
    except ValueError:
        raise LabFrameError(f"{name.decode()} must be a number") from None
    if not low <= value <= high:
        raise LabFrameError(f"{name.decode()} must be within {low}-{high}")
    return value


def _data(fields: Mapping[bytes, bytes]) -> bytes:
    data = fields.get(b"d", b"")
    if len(data) > MAX_CHUNK:
        raise LabFrameError(f"a piece of data over {MAX_CHUNK} bytes")
    return data


def _kind(fields: Mapping[bytes, bytes]) -> str:
    kind = fields.get(b"k", b"")
    if kind not in (b"t", b"b"):
        raise LabFrameError("a message's k must be t (text) or b (binary)")
    return kind.decode()


def _more(fields: Mapping[bytes, bytes]) -> bool:
    return fields.get(b"n") == b"1"


def message_entries(data: bytes, kind: str) -> list[dict[str, bytes | str]]:
    """The ``w`` entries of one message (pieces of at most ``MAX_CHUNK``, ``n`` on all but the
    last); ValueError past ``MAX_MESSAGE_BYTES``."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message over {MAX_MESSAGE_BYTES} bytes")
    pieces = safe_chunks(data)
    out: list[dict[str, bytes | str]] = []
    for i, piece in enumerate(pieces):
        entry: dict[str, bytes | str] = {"t": "w", "d": piece, "k": kind}
        if i < len(pieces) - 1:
            entry["n"] = "1"
        out.append(entry)
    return out


class MessageJoiner:
    """Joins the pieces of messages (``n``) back into whole messages, bounded."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, entry: Entry) -> bytes | None:
        """The whole message once its last piece arrives (None before); LabFrameError past
        ``MAX_MESSAGE_BYTES`` (what was held is dropped)."""
        self.size += len(entry.data)
        if self.size > MAX_MESSAGE_BYTES:
            self.parts, self.size = [], 0
            raise LabFrameError(f"a message over {MAX_MESSAGE_BYTES} bytes")
        self.parts.append(entry.data)
        if entry.more:
            return None
        whole = b"".join(self.parts)
        self.parts, self.size = [], 0
        return whole


def parse_in(fields: Mapping[bytes, bytes], base_url: str) -> Entry:
    """An entry toward Jupyter, checked (``LabFrameError`` otherwise)."""
    exchange = _text(fields, b"x", 32)
    if not EXCHANGE_ID.fullmatch(exchange):
        raise LabFrameError("x must be 32 hexadecimal digits")
    kind = _text(fields, b"t", 1)
    if kind == "h":
        method = _text(fields, b"m", 8)
        if method not in METHODS:
            raise LabFrameError(f"method {method[:8]!r} is not relayed")
        path = check_path(_text(fields, b"p", MAX_PATH_CHARS), base_url)
        headers = check_headers(_json(fields))
        return Entry("h", exchange, method=method, path=path, headers=headers)
    if kind == "o":
        path = check_path(_text(fields, b"p", MAX_PATH_CHARS), base_url)
        return Entry("o", exchange, path=path, headers=check_headers(_json(fields)))
    if kind == "b":
        return Entry("b", exchange, data=_data(fields))
    if kind == "w":
        return Entry("w", exchange, data=_data(fields), kind=_kind(fields), more=_more(fields))
    if kind in ("e", "p"):
        return Entry(kind, exchange)
    if kind == "c":
        code = _int(fields, b"cc", 1000, 4999) if b"cc" in fields else 1000
        return Entry("c", exchange, code=code)
    raise LabFrameError(f"unknown entry type {kind!r}")


def parse_out(fields: Mapping[bytes, bytes]) -> Entry:
    """An entry toward the portal, checked (``LabFrameError`` otherwise)."""
    kind = _text(fields, b"t", 1)
    if kind == "h":
        status = _int(fields, b"s", 100, 599)
        return Entry("h", "", status=status, headers=check_headers(_json(fields)))
    if kind == "b":
        return Entry("b", "", data=_data(fields))
    if kind == "e":
        return Entry("e", "")
    if kind == "o":
        return Entry("o", "", subprotocol=_text(fields, b"sp", 256))
    if kind == "w":
        return Entry("w", "", data=_data(fields), kind=_kind(fields), more=_more(fields))
    if kind == "c":
        return Entry("c", "", code=_int(fields, b"cc", 1000, 4999) if b"cc" in fields else 1000)
    if kind == "f":
        return Entry("f", "", reason=_text(fields, b"r", 1000))
    raise LabFrameError(f"unknown entry type {kind!r}")


def _json(fields: Mapping[bytes, bytes]) -> Any:
    try:
        return json.loads(_text(fields, b"hd", MAX_HEADERS_BYTES * 2) or "[]")
    except json.JSONDecodeError:
        raise LabFrameError("hd is not JSON") from None


def forwarded_request_headers(headers: Sequence[tuple[str, str]], token: str) -> Headers:
    """What Jupyter sees of the browser's headers: ``DROPPED_REQUEST_HEADERS`` gone, its
    token added (the only ``Authorization`` it ever gets)."""
    kept = [(n, v) for n, v in headers if n.lower() not in DROPPED_REQUEST_HEADERS]
    return (*kept, (TOKEN_HEADER, f"token {token}"))


def returned_response_headers(headers: Sequence[tuple[str, str]]) -> Headers:
    """What the browser sees of Jupyter's headers: ``DROPPED_RESPONSE_HEADERS`` gone."""
    return tuple((n, v) for n, v in headers if n.lower() not in DROPPED_RESPONSE_HEADERS)


def safe_chunks(data: bytes, size: int = MAX_CHUNK) -> list[bytes]:
    """``data`` cut into pieces of at most ``size`` bytes (one empty piece for nothing)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


class TokenScrubber:
    """Removes every occurrence of a secret from a stream of bytes cut anywhere.

    Keeps back the last ``len(secret) - 1`` bytes of what it was fed until more arrive, so a
    secret split between two pieces is found too; ``flush`` gives what it kept at the end.
    """

    def __init__(self, secret: bytes, replacement: bytes = b"") -> None:
        if not secret:
            raise ValueError("nothing to scrub")
        self.secret = secret
        self.replacement = replacement
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        """What of ``held + data`` can go now, the secret removed."""
        text = self.held + data
        while self.secret in text:  # a removal may join two halves into a new one
            text = text.replace(self.secret, self.replacement)
        keep = len(self.secret) - 1
        # A secret cannot start in what goes: any tail that could begin one stays.
        cut = len(text) - keep if len(text) > keep else 0
        self.held = text[cut:]
        return text[:cut]

    def flush(self) -> bytes:
        """The rest (which cannot hold the whole secret)."""
        rest, self.held = self.held, b""
        return rest
