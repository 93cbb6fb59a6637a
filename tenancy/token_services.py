"""API token services: every write to ``ApiToken`` goes through here.

``check_*`` validate, ``do_*`` change state; the secret leaves only in the
``IssuedToken`` that ``do_create_token`` returns (it is stored hashed).

Two policies of issue 35 (docs/tokens.md, "Lifetime" and "Revoked for you"):

- **Lifetime**: a new token lasts at most ``lifetime_policy(user).days``, the site's
  ``API_TOKEN_MAX_DAYS`` or a tenant's ``max_token_days`` if that is shorter (a request
  over it is refused naming the field and the maximum); a token is refused once it is
  that old under the policy of the moment (``do_use_token``), whatever its expiry said.
- **Revocation**: ``do_revoke_user_tokens`` revokes a user's live tokens when the user
  is disabled, changes password, or loses a role a token relied on
  (``tenancy.signals`` calls it on those changes, whatever made them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from audit import services as audit
from tenancy.models import ApiToken, Membership, Tenant, TokenScope
from tenancy.services import TenancyError
from tenancy.tokens import (
    MAX_NAME_LENGTH,
    display_prefix,
    expiry,
    hash_secret,
    needs_touch,
    new_secret,
    refusal,
    strictest_days,
)

TOKEN_AUDIT_FIELDS = ("name", "scope", "prefix", "expires_at")
"""What the audit log keeps of a token: never its secret nor its hash."""

DEFAULT_NAME = "default"
"""The name ``do_issue_token`` gives when none is asked for (then ``default-2``, ...)."""


class TokenRefused(Exception):
    """A presented token that may not be used, with the message the client gets (401)."""


class TokenLifetimeError(TenancyError):
    """A lifetime the policy refuses; ``field`` is the request's field it is about (400)."""

    field = "expires_in_days"


@dataclass(frozen=True)
class LifetimePolicy:
    """The longest a new token of a user may live, and whose maximum that is."""

    days: int
    source: str  # "the site's maximum (API_TOKEN_MAX_DAYS)", "tenant 'acme''s maximum"


def site_max_days() -> int:
    """``API_TOKEN_MAX_DAYS``: no token of anyone lives longer."""
    return int(settings.API_TOKEN_MAX_DAYS)


def lifetime_policy(user: AbstractBaseUser | AnonymousUser | None) -> LifetimePolicy:
    """The strictest maximum lifetime for ``user``'s tokens: the site's, or a tenant's.

    A token acts in every tenant its user belongs to, so the shortest maximum among
    those tenants applies (tenants that set none do not count).
    """
    site = site_max_days()
    if user is not None and user.is_authenticated:
        strictest = (
            Tenant.objects.filter(memberships__user_id=user.pk, max_token_days__isnull=False)
            .order_by("max_token_days", "slug")
            .values_list("slug", "max_token_days")
            .first()
        )
        if strictest is not None:
            slug, days = strictest
            if days is not None and days < site:
                return LifetimePolicy(days=days, source=f"tenant {slug!r}'s maximum")
    return LifetimePolicy(days=site, source="the site's maximum (API_TOKEN_MAX_DAYS)")


@dataclass(frozen=True)
class IssuedToken:
    """A token just made, with its secret: the only time the secret is known."""

    token: ApiToken
    secret: str


def check_token_name(*, user: AbstractBaseUser, name: str) -> str:
    """``name`` stripped, if it is a valid name for a new token of ``user``."""
    name = name.strip()
    if not name:
        raise TenancyError("a token needs a name")
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise TenancyError(f"a token name is at most {MAX_NAME_LENGTH} printable characters")
    if ApiToken.objects.filter(user_id=user.pk, name=name, revoked_at__isnull=True).exists():
        raise TenancyError(f"you already have a token named {name!r}")
    return name


def check_expiry_days(days: int | None, user: AbstractBaseUser | None = None) -> int:
    """The lifetime in days of a new token of ``user``: ``days``, or ``API_TOKEN_DAYS`` when
    None (shortened to the maximum); ``TokenLifetimeError`` naming the maximum past it."""
    policy = lifetime_policy(user)
    if days is None:
        return min(int(settings.API_TOKEN_DAYS), policy.days)
    if days < 1:
        raise TokenLifetimeError("a token lasts at least 1 day")
    if days > policy.days:
        raise TokenLifetimeError(f"a token lasts at most {policy.days} days ({policy.source})")
    return days


def check_scope(scope: str) -> str:
    """``scope`` if it is a token scope."""
    if scope not in TokenScope.values:
        raise TenancyError(f"unknown scope {scope!r} (known: {', '.join(TokenScope.values)})")
    return scope


def do_create_token(
    *,
    user: AbstractBaseUser | AnonymousUser,
    name: str,
    scope: str = TokenScope.WRITE,
    expires_in_days: int | None = None,
    now: datetime | None = None,
) -> IssuedToken:
    """Make a named token for ``user``; the returned secret is not stored anywhere."""
    if not isinstance(user, AbstractBaseUser) or not user.is_authenticated:
        raise TenancyError("only a signed-in user has API tokens")
    name = check_token_name(user=user, name=name)
    days = check_expiry_days(expires_in_days, user)
    check_scope(scope)
    now = now or timezone.now()
    secret = new_secret()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user_id=user.pk,
                name=name,
                scope=scope,
                key_hash=hash_secret(secret),
                prefix=display_prefix(secret),
                created_at=now,
                expires_at=expiry(now, days),
            )
            audit.record(
                "token.create",
                obj=token,
                user=user,
                after=audit.snapshot(token, TOKEN_AUDIT_FIELDS),
            )
    except IntegrityError:  # the same name made at the same moment by another request
        raise TenancyError(f"you already have a token named {name!r}") from None
    return IssuedToken(token=token, secret=secret)


def free_name(*, user: AbstractBaseUser, base: str = DEFAULT_NAME) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first name ``user`` has no live token of."""
    taken = set(
        ApiToken.objects.filter(user_id=user.pk, revoked_at__isnull=True).values_list(
            "name", flat=True
        )
    )
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def do_issue_token(
    *,
    user: AbstractBaseUser | AnonymousUser,
    name: str | None = None,
    scope: str = TokenScope.WRITE,
    expires_in_days: int | None = None,
) -> str:
    """Make a token for ``user`` and return its secret (``issuetoken``, tests).

    Without ``name`` the token is called ``default`` (or ``default-2``, ... when taken),
    so issuing again never invalidates a token that a running client holds.
    """
    if not isinstance(user, AbstractBaseUser) or not user.is_authenticated:
        raise TenancyError("only a signed-in user has API tokens")
    issued = do_create_token(
        user=user,
        name=name if name is not None else free_name(user=user),
        scope=scope,
        expires_in_days=expires_in_days,
    )
    return issued.secret


@transaction.atomic
def do_revoke_token(*, user: AbstractBaseUser | AnonymousUser, token_id: int) -> ApiToken:
    """Revoke one of ``user``'s tokens (another user's is ``ApiToken.DoesNotExist``).

    Revoking a revoked token changes nothing and leaves no audit row.
    """
    token = ApiToken.objects.restrict(user).select_for_update().get(pk=token_id)
    return _revoke(token, user)


@transaction.atomic
def do_revoke_any_token(*, admin: AbstractBaseUser, token_id: int) -> ApiToken:
    """A cluster admin revokes anyone's token (the Django admin's action); others are refused."""
    if not getattr(admin, "is_staff", False):
        raise TenancyError("only a cluster admin may revoke another user's token")
    token = ApiToken.objects.select_for_update().get(pk=token_id)
    return _revoke(token, admin)


def _revoke(
    token: ApiToken, user: AbstractBaseUser | AnonymousUser | None, reason: str = ""
) -> ApiToken:
    """Mark ``token`` revoked now and record it (with ``reason``), unless it is revoked already."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        after = audit.snapshot(token, ["revoked_at"])
        if reason:
            after["reason"] = reason
        audit.record(
            "token.revoke",
            obj=token,
            user=user,
            before={"revoked_at": None},
            after=after,
        )
    return token


def do_revoke_user_tokens(
    *, user_id: int, reason: str, scopes: Iterable[str] | None = None
) -> list[ApiToken]:
    """Revoke every live token of user ``user_id`` (only those of ``scopes`` if given).

    The user's access changed under their tokens (disabled, a new password, a role
    lost: ``tenancy.signals``); each revocation is audited with ``reason``, as made by
    whoever made that change. Expired and revoked tokens are left as they are.
    """
    with transaction.atomic():
        tokens = ApiToken.objects.select_for_update().filter(
            user_id=user_id, revoked_at__isnull=True, expires_at__gt=timezone.now()
        )
        if scopes is not None:
            tokens = tokens.filter(scope__in=list(scopes))
        return [_revoke(token, None, reason) for token in tokens.order_by("pk")]


def do_use_token(*, secret: str, now: datetime | None = None) -> ApiToken:
    """The live token whose secret is ``secret``, its use written down (at most once a minute).

    Raises ``TokenRefused`` with the client's message for an unknown, revoked or
    expired token (older than the lifetime policy allows now counts as expired), or one
    whose user is inactive.
    """
    now = now or timezone.now()
    strictest_tenant = (
        Membership.objects.filter(user_id=OuterRef("user_id"), tenant__max_token_days__isnull=False)
        .order_by("tenant__max_token_days")
        .values("tenant__max_token_days")[:1]
    )
    token = (
        ApiToken.objects.select_related("user")
        .annotate(tenant_max_days=Subquery(strictest_tenant))
        .filter(key_hash=hash_secret(secret))
        .first()
    )
    if token is None or not token.user.is_active:
        raise TokenRefused("invalid token")
    reason = refusal(
        revoked_at=token.revoked_at,
        expires_at=token.expires_at,
        now=now,
        created_at=token.created_at,
        max_days=strictest_days(site_max_days(), token.tenant_max_days),  # type: ignore[attr-defined]
    )
    if reason is not None:
        raise TokenRefused(reason)
    if needs_touch(token.last_used_at, now):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
