"""Telling a user's open live sockets that what they may see has changed.

Every live socket (``portal.consumers.LiveConsumer``) joins its user's own group
besides the groups of the topics it shows.  Tenancy sends that group a control
message whenever the user's access may have changed; each socket of the user
then re-checks its session and every subscription, drops what the user may no
longer see and closes itself when the session is over::

    membership added / role changed / removed ─┐
    user saved (deactivated, staff flag) ──────┼─ after commit ─> user-<id>: access.recheck
    user deleted ──────────────────────────────┘
    user_logged_out ──────────────────────────── now ──────────> user-<id>: session.ended
                                                                 (sha256 of the session key)

The session key itself never crosses Redis: only its digest, which the socket
compares with the digest of its own.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

RECHECK = "access.recheck"
SESSION_ENDED = "session.ended"


def user_group(user_id: int) -> str:
    """The group every live socket of one user joins (control messages only, never events)."""
    return f"user-{int(user_id)}"


def session_digest(session_key: str | None) -> str:
    """A digest that names a session without revealing its key ("" for no session)."""
    if not session_key:
        return ""
    return hashlib.sha256(session_key.encode()).hexdigest()


def _send(user_id: int, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(user_group(user_id), message)
    except Exception:  # the change is committed; the sockets' periodic re-check catches up
        log.warning("could not tell user %s's live sockets: %s", user_id, message["type"])


def recheck_on_commit(user_id: int) -> None:
    """Ask every live socket of the user to re-check its access once this transaction commits."""
    transaction.on_commit(lambda: _send(user_id, {"type": RECHECK}))


def end_session_sockets(user_id: int, session_key: str | None) -> None:
    """Close the user's live sockets that belong to the session ``session_key`` (a logout)."""
    _send(user_id, {"type": SESSION_ENDED, "session": session_digest(session_key)})
