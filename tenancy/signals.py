"""Signal receivers: access changes reach open live sockets and API tokens; sign-ins feed
the rate limiter.

Connected in ``TenancyConfig.ready``; see ``tenancy.live_access`` for the messages,
``tenancy.login_limits`` for the counting and ``tenancy.token_services`` for tokens.

API tokens are revoked when what they relied on goes (issue 35; docs/tokens.md), on
whatever path made the change (the admin, a service, single sign-on, a script that saves
the model):

    the user is disabled (is_active off) ........... every live token
    the user's password changes (or is removed) .... every live token
    staff or superuser taken away .................. every live token
    a membership removed ........................... every live token
    a role lowered (owner → member, member → viewer)  the write tokens

A token is not bound to a tenant: it acts with all its user's roles, so losing any of
them revokes it (a read token survives a lowered role: reading needs only membership).
Django's own re-hash of an unchanged password at sign-in (a new hasher or iteration
count) is not a change of password and revokes nothing.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import is_password_usable
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_delete, post_save, pre_save

from tenancy.live_access import end_session_sockets, recheck_on_commit
from tenancy.login_limits import client_address, forget_pair, record_failure
from tenancy.models import Membership, Role, Tenant, TokenScope
from tenancy.oidc_roles import role_rank
from tenancy.token_services import do_revoke_user_tokens

# A login stamps ``last_login``: no one's access changes with that.
_LOGIN_ONLY = frozenset({"last_login"})
_USER_ACCESS = ("password", "is_active", "is_staff", "is_superuser")
_BEFORE = "_tenancy_before"  # the saved row's values, kept on the instance by pre_save


def _saved_fields(kwargs: dict[str, Any]) -> frozenset[str] | None:
    fields = kwargs.get("update_fields")
    return None if fields is None else frozenset(fields)


def user_about_to_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Remember what a user's access was before this save (tokens rely on it)."""
    fields = _saved_fields(kwargs)
    if instance.pk is None or kwargs.get("raw") or (fields is not None and fields <= _LOGIN_ONLY):
        return
    before = sender.objects.filter(pk=instance.pk).values(*_USER_ACCESS).first()
    setattr(instance, _BEFORE, before)


def _password_changed(instance: Any, old: str, fields: frozenset[str] | None) -> bool:
    new = instance.password
    if new == old:
        return False
    # Django re-hashes an unchanged password at sign-in (``check_password``'s setter):
    # it saves only the password, without the raw one ``set_password`` keeps.
    rehash = (
        getattr(instance, "_password", None) is None
        and fields == frozenset({"password"})
        and is_password_usable(old)
        and is_password_usable(new)
    )
    return not rehash


def user_access_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Revoke the user's tokens when their account is disabled, its password changes or
    it loses staff or superuser."""
    before = instance.__dict__.pop(_BEFORE, None)
    if before is None or kwargs.get("created"):
        return
    reasons = []
    if before["is_active"] and not instance.is_active:
        reasons.append("the user was disabled")
    if _password_changed(instance, before["password"], _saved_fields(kwargs)):
        reasons.append("the user's password changed")
    if before["is_staff"] and not instance.is_staff:
        reasons.append("the user is no longer a cluster admin (staff)")
    if before["is_superuser"] and not instance.is_superuser:
        reasons.append("the user is no longer a superuser")
    if reasons:
        do_revoke_user_tokens(user_id=instance.pk, reason="; ".join(reasons))


def membership_about_to_change(sender: Any, instance: Membership, **kwargs: Any) -> None:
    """Remember a membership's role before this save."""
    if instance.pk is None or kwargs.get("raw"):
        return
    role = Membership.objects.filter(pk=instance.pk).values_list("role", flat=True).first()
    setattr(instance, _BEFORE, role)


def _tenant_name(membership: Membership) -> str:
    slug = Tenant.objects.filter(pk=membership.tenant_id).values_list("slug", flat=True).first()
    return repr(slug) if slug is not None else f"#{membership.tenant_id}"


def membership_role_changed(sender: Any, instance: Membership, **kwargs: Any) -> None:
    """A lowered role revokes the user's write tokens (they relied on the higher role)."""
    old = instance.__dict__.pop(_BEFORE, None)
    if old is None or kwargs.get("created") or role_rank(instance.role) >= role_rank(old):
        return
    do_revoke_user_tokens(
        user_id=instance.user_id,
        reason=f"role in tenant {_tenant_name(instance)} lowered from {Role(old).label.lower()} "
        f"to {Role(instance.role).label.lower()}",
        scopes=[TokenScope.WRITE],
    )


def membership_removed(sender: Any, instance: Membership, **kwargs: Any) -> None:
    """A membership removed revokes all its user's tokens."""
    do_revoke_user_tokens(
        user_id=instance.user_id, reason=f"membership of tenant {_tenant_name(instance)} removed"
    )


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
    """A successful sign-in clears its (account, address) failure count."""
    if request is not None:
        forget_pair(user.get_username(), client_address(request))


def connect() -> None:
    """Connect the receivers (once: ``dispatch_uid`` makes repeats harmless)."""
    user_model = get_user_model()
    post_save.connect(membership_changed, sender=Membership, dispatch_uid="tenancy-member-save")
    post_delete.connect(membership_changed, sender=Membership, dispatch_uid="tenancy-member-del")
    post_save.connect(user_changed, sender=user_model, dispatch_uid="tenancy-user-save")
    post_delete.connect(user_changed, sender=user_model, dispatch_uid="tenancy-user-del")
    # API tokens follow their user's access (issue 35).
    pre_save.connect(user_about_to_change, sender=user_model, dispatch_uid="tenancy-token-user-pre")
    post_save.connect(user_access_changed, sender=user_model, dispatch_uid="tenancy-token-user")
    pre_save.connect(
        membership_about_to_change, sender=Membership, dispatch_uid="tenancy-token-member-pre"
    )
    post_save.connect(
        membership_role_changed, sender=Membership, dispatch_uid="tenancy-token-member-save"
    )
    post_delete.connect(
        membership_removed, sender=Membership, dispatch_uid="tenancy-token-member-del"
    )
    user_logged_out.connect(logged_out, dispatch_uid="tenancy-logged-out")
    user_login_failed.connect(login_failed, dispatch_uid="tenancy-login-failed")
    user_logged_in.connect(logged_in, dispatch_uid="tenancy-logged-in")
