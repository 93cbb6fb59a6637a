"""How a browser signed in to the portal becomes signed in to one lab's host, and no more.

A lab's host (``portal.lab_hosts``) never sees the portal's cookie (it is host-only), so
the portal hands the browser over once::

    portal  GET /sessions/42/lab-open/      signed in, may open 42?  ──> mint a ticket
            302 https://42.labs.example.com/sessions/42/lab/?lab_ticket=T
    lab     GET ...?lab_ticket=T            signed, <= 60 s old, for 42, never used?
            302 the same URL without it,    Set-Cookie lab_42=C (HttpOnly, host-only,
                                            path /sessions/42/lab/, SameSite=Lax)
    lab     every request and WebSocket:    C signed, for 42, not expired, its user
                                            active, password unchanged, may open 42?

A ticket is signed (``django.core.signing``, its own salt), names its user, its session
and a random nonce, and is good for ``TICKET_MAX_AGE_S`` and one use (the nonce is spent
in Redis). The cookie is signed with another salt, names its user, its session and a
mark of the user's password hash (a changed password ends it), and lasts
``LAB_COOKIE_SECONDS``. Neither is secret from the browser; neither can be made by it.
Whether the user may open the session is asked again on every request: a member removed
from the tenant loses the lab at once.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.utils.crypto import constant_time_compare, salted_hmac

TICKET_SALT = "portal.lab-ticket"
COOKIE_SALT = "portal.lab-cookie"
TICKET_MAX_AGE_S = 60
SPENT_TTL_S = 2 * TICKET_MAX_AGE_S
"""How long a spent nonce is remembered: past the ticket's own age, it is refused anyway."""
TICKET_PARAM = "lab_ticket"


class LabAuthError(Exception):
    """A ticket or cookie that signs no one in; the message says why (for the log)."""


@dataclass(frozen=True)
class Ticket:
    """What a valid ticket says: who, to which session, and its one-use nonce."""

    user_id: int
    job_id: int
    nonce: str


def mint_ticket(user_id: int, job_id: int) -> str:
    """A fresh ticket for ``user_id`` to session ``job_id``'s lab."""
    payload = {"u": int(user_id), "j": int(job_id), "n": secrets.token_hex(16)}
    return signing.dumps(payload, salt=TICKET_SALT)


def read_ticket(value: str, job_id: int, *, max_age: int = TICKET_MAX_AGE_S) -> Ticket:
    """The ticket ``value`` for session ``job_id``; ``LabAuthError`` when it is tampered
    with, older than ``max_age`` seconds, for another session or malformed. (Its nonce is
    spent by the caller: :func:`spent_key`.)"""
    payload = _load(value, TICKET_SALT, max_age)
    nonce = payload.get("n")
    if not isinstance(nonce, str) or len(nonce) != 32:
        raise LabAuthError("a ticket without its nonce")
    return Ticket(_id(payload, "u"), _session(payload, job_id), nonce)


def spent_key(ticket: Ticket) -> str:
    """The Redis key that marks ``ticket`` used (``SET key 1 NX EX SPENT_TTL_S``)."""
    return f"lab-ticket:{ticket.nonce}"


def cookie_name(job_id: int) -> str:
    """The name of session ``job_id``'s cookie on its lab host."""
    return f"lab_{int(job_id)}"


def user_mark(user: Any) -> str:
    """A mark of ``user``'s password hash: a cookie made before a password change is refused."""
    return salted_hmac(COOKIE_SALT + ".user", user.get_session_auth_hash()).hexdigest()[:24]


def cookie_value(user: Any, job_id: int) -> str:
    """The signed cookie that signs ``user`` in to session ``job_id``'s lab host."""
    payload = {"u": int(user.pk), "j": int(job_id), "m": user_mark(user)}
    return signing.dumps(payload, salt=COOKIE_SALT)


def read_cookie(value: str, job_id: int, *, max_age: int) -> tuple[int, str]:
    """The user id and password mark of cookie ``value`` for session ``job_id``;
    ``LabAuthError`` when tampered with, expired, for another session or malformed."""
    payload = _load(value, COOKIE_SALT, max_age)
    mark = payload.get("m")
    if not isinstance(mark, str):
        raise LabAuthError("a cookie without its user's mark")
    _session(payload, job_id)
    return _id(payload, "u"), mark


def mark_matches(user: Any, mark: str) -> bool:
    """Whether ``mark`` (from a cookie) is ``user``'s current one."""
    return constant_time_compare(mark, user_mark(user))


def _load(value: str, salt: str, max_age: int) -> dict[str, Any]:
    try:
        payload = signing.loads(value, salt=salt, max_age=max_age)
    except signing.SignatureExpired:
        raise LabAuthError("expired") from None
    except signing.BadSignature:
        raise LabAuthError("a bad signature") from None
    if not isinstance(payload, dict):
        raise LabAuthError("malformed")
    return payload


def _id(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LabAuthError(f"malformed {key!r}")
    return value


def _session(payload: dict[str, Any], job_id: int) -> int:
    if _id(payload, "j") != int(job_id):
        raise LabAuthError("for another session")
    return int(job_id)
