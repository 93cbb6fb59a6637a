"""Signal receivers: access changes reach open live sockets; sign-ins feed the rate limiter.

Connected in ``TenancyConfig.ready``; see ``tenancy.live_access`` for the messages
and ``tenancy.login_limits`` for the counting.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_delete, post_save

from tenancy.live_access import end_session_sockets, recheck_on_commit
from tenancy.login_limits import client_address, forget_account, record_failure
from tenancy.models import Membership

# A login stamps ``last_login``: no one's access changes with that.
_LOGIN_ONLY = frozenset({"last_login"})


def membership_changed(sender: Any, instance: Membership, **kwargs: Any) -> None:
    """A membership was added, its role changed or it was removed (tenant deletes included)."""
    recheck_on_commit(instance.user_id)


def user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A user was saved (deactivated, made or unmade staff, new password) or deleted."""
    if kwargs.get("created"):
        return  # a new user has no socket yet
    fields = kwargs.get("update_fields")
    if fields is not None and frozenset(fields) <= _LOGIN_ONLY:
        return
    if instance.pk is not None:
        recheck_on_commit(instance.pk)


def logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """A session ended by logout: its sockets close (the user's other sessions stay)."""
    if user is None or request is None:
        return
    end_session_sockets(user.pk, getattr(request.session, "session_key", None))


def login_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
) -> None:
    """Count a failed sign-in that came with a request (a client on the network)."""
    if request is not None:
        record_failure(str(credentials.get("username") or ""), client_address(request))


def logged_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """A successful sign-in clears its account's failure count."""
    forget_account(user.get_username())


def connect() -> None:
    """Connect the receivers (once: ``dispatch_uid`` makes repeats harmless)."""
    user_model = get_user_model()
    post_save.connect(membership_changed, sender=Membership, dispatch_uid="tenancy-member-save")
    post_delete.connect(membership_changed, sender=Membership, dispatch_uid="tenancy-member-del")
    post_save.connect(user_changed, sender=user_model, dispatch_uid="tenancy-user-save")
    post_delete.connect(user_changed, sender=user_model, dispatch_uid="tenancy-user-del")
    user_logged_out.connect(logged_out, dispatch_uid="tenancy-logged-out")
    user_login_failed.connect(login_failed, dispatch_uid="tenancy-login-failed")
    user_logged_in.connect(logged_in, dispatch_uid="tenancy-logged-in")
