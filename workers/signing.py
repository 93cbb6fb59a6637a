"""Signed envelopes for the agent protocol: who sent a message, when, and that nobody changed it.

Redis is a transport, not a trust root: anyone who can write to it can put a
task on a queue.  So every command and every report travels in an envelope::

    {"node": "gpu-3", "ts": 1764572400.25, "body": {...message...}, "sig": "<hex>"}

    sig = HMAC-SHA256(node_key(node), canonical_json({"node", "ts", "body"}))
    node_key(node) = HMAC-SHA256(master secret, "agent-node:" + node)

The control plane holds the master secret and derives any node's key; an
agent holds only its own node's key, so a node that is taken over can sign
as itself and nobody else.  A command to ``gpu-3`` is signed with
``gpu-3``'s key, a report from ``gpu-3`` too; the receiver checks the
signature, the node, and the timestamp against a window (``max_age_s`` into
the past, ``max_skew_s`` into the future) and refuses everything else with a
reason it can log.  The window bounds how long a captured message can be
replayed; the protocol's own ids (``command_id``, event ids) make a replay
inside it a no-op.

Pure Python: no Django, Celery or torch.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENVELOPE_FIELDS = frozenset({"node", "ts", "body", "sig"})
DEFAULT_MAX_AGE_S = 900.0
"""How old a message may be when it is checked (a redelivered command, a queued report)."""
DEFAULT_MAX_SKEW_S = 60.0
"""How far in the future a timestamp may be (clocks of two machines disagree)."""
KEY_BYTES = 32


class SignatureError(ValueError):
    """A message that is not a valid signed envelope; the text says why (for the log)."""


@dataclass(frozen=True)
class Signed:
    """A checked envelope: the node that signed it, its timestamp, and the message."""

    node: str
    ts: float
    body: dict[str, Any]
    sig: str = ""
    """The signature: the envelope's id (one per node, timestamp and body)."""


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def master_secret(configured: str, fallback: str) -> bytes:
    """The master secret: ``configured`` when set, else one derived from ``fallback``.

    The portal passes ``AGENT_SIGNING_KEY`` and ``SECRET_KEY``: a deployment
    that sets only ``SECRET_KEY`` still gets a secret nobody else knows, and
    rotating ``AGENT_SIGNING_KEY`` does not log users out.
    """
    if configured:
        return configured.encode()
    return hmac.new(fallback.encode(), b"agent-signing-master", hashlib.sha256).digest()


def node_key(master: bytes, node: str) -> bytes:
    """The key of one node's agent, derived from the master secret."""
    return hmac.new(master, b"agent-node:" + node.encode(), hashlib.sha256).digest()


def key_to_text(key: bytes) -> str:
    """A key as an operator hands it to an agent (``AGENT_KEY``): hex."""
    return key.hex()


def key_from_text(text: str) -> bytes:
    """Read a key given as hex (``AGENT_KEY`` or the content of ``AGENT_KEY_FILE``)."""
    cleaned = text.strip()
    try:
        key = bytes.fromhex(cleaned)
    except ValueError:
        raise SignatureError("an agent key must be hex") from None
    if len(key) != KEY_BYTES:
        raise SignatureError(f"an agent key must be {KEY_BYTES} bytes ({2 * KEY_BYTES} hex digits)")
    return key


def read_key(*, key: str | None, key_file: str | None) -> bytes:
    """The agent's key from its value or from a file; exactly one must be given."""
    if key and key_file:
        raise SignatureError("give AGENT_KEY or AGENT_KEY_FILE, not both")
    if key:
        return key_from_text(key)
    if key_file:
        try:
            return key_from_text(Path(key_file).read_text())
        except OSError as exc:
            raise SignatureError(f"cannot read AGENT_KEY_FILE {key_file}: {exc}") from None
    raise SignatureError("no agent key: set AGENT_KEY or AGENT_KEY_FILE (manage.py agentkey NODE)")


def _digest(key: bytes, node: str, ts: float, body: Mapping[str, Any]) -> str:
    signed = canonical_json({"node": node, "ts": ts, "body": body})
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def seal(body: Mapping[str, Any], *, node: str, key: bytes, now: float) -> dict[str, Any]:
    """The envelope of ``body`` signed by (or for) ``node`` with its key at time ``now``."""
    plain = dict(body)
    return {"node": node, "ts": now, "body": plain, "sig": _digest(key, node, now, plain)}


def open_envelope(
    data: Any,
    *,
    key_for: Callable[[str], bytes | None],
    now: float,
    expected_node: str | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
    first_received: Callable[[str], float] | None = None,
) -> Signed:
    """Check an envelope and return what it carries; raise ``SignatureError`` saying why not.

    ``key_for`` gives a node's key (None: no such node); ``expected_node``,
    when given, is the only node whose envelopes are accepted (an agent
    accepts only commands for itself).

    The age is judged at ``now``, or, with ``first_received``, at the time
    the receiver first saw this envelope: it is called with the signature
    (the envelope's id) once the signature is found valid, and returns that
    time. A receiver that retries a message (a database outage) thus accepts
    its own retries of an envelope that was fresh when it first came, for as
    long as it remembers the first receipt, and nothing older.
    """
    if not isinstance(data, dict):
        raise SignatureError(f"unsigned: a {type(data).__name__}, not an envelope")
    if set(data) != ENVELOPE_FIELDS:
        raise SignatureError("unsigned: not an envelope (node, ts, body, sig)")
    node, ts, body, sig = data["node"], data["ts"], data["body"], data["sig"]
    if not isinstance(node, str) or not node:
        raise SignatureError("envelope.node must be a non-empty string")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise SignatureError("envelope.ts must be a number")
    if not isinstance(body, dict):
        raise SignatureError("envelope.body must be an object")
    if not isinstance(sig, str):
        raise SignatureError("envelope.sig must be a string")
    if expected_node is not None and node != expected_node:
        raise SignatureError(f"wrong node: signed for {node!r}, this is {expected_node!r}")
    key = key_for(node)
    if key is None:
        raise SignatureError(f"unknown node {node!r}")
    try:
        expected = _digest(key, node, ts, body)
    except (TypeError, ValueError):
        raise SignatureError("envelope.body is not JSON data") from None
    if not hmac.compare_digest(expected, sig):
        raise SignatureError(f"bad signature for node {node!r}")
    at = now if first_received is None else min(first_received(sig), now)
    received = "" if at == now else f" when first received {now - at:.0f} s ago"
    if ts < at - max_age_s:
        raise SignatureError(
            f"stale: signed {at - ts:.0f} s before it was received{received} "
            f"(at most {max_age_s:.0f} s)"
        )
    if ts > at + max_skew_s:
        raise SignatureError(f"from the future: {ts - at:.0f} s ahead (at most {max_skew_s:.0f} s)")
    return Signed(node=node, ts=float(ts), body=body, sig=sig)
