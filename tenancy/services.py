"""Tenancy services: every write to tenants and members goes through here.

API tokens have their own: ``tenancy.token_services``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils.text import slugify

from tenancy.models import WRITE_ROLES, Membership, Role, Tenant


class TenancyError(ValueError):
    """A tenancy request that is refused, with a message for the user."""


@dataclass(frozen=True)
class TenantCreated:
    """What ``do_create_tenant`` made."""

    tenant: Tenant
    owner_created: bool


def check_slug(slug: str) -> str:
    """Return ``slug`` if it is a valid, unused tenant slug."""
    if not slug or slugify(slug) != slug or len(slug) > 50:
        raise TenancyError(
            f"invalid tenant slug {slug!r}: use lowercase letters, digits and hyphens (max 50)"
        )
    if Tenant.objects.filter(slug=slug).exists():
        raise TenancyError(f"tenant {slug!r} already exists")
    return slug


def check_password_strength(*, username: str, password: str) -> None:
    """Refuse a password that ``AUTH_PASSWORD_VALIDATORS`` reject for ``username``.

    The user may exist already (their other attributes are compared too) or not yet.
    """
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first() or user_model(username=username)
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise TenancyError("password refused: " + " ".join(exc.messages)) from exc


@transaction.atomic
def do_create_tenant(
    *,
    slug: str,
    owner_username: str,
    name: str | None = None,
    password: str | None = None,
    gpu_quota: int = 8,
    email: str = "",
    profile_jobs: bool = True,
    max_queued_jobs: int | None = None,
) -> TenantCreated:
    """Create a tenant and make ``owner_username`` its owner (creating that user if needed).

    ``max_queued_jobs`` defaults to ``DEFAULT_TENANT_MAX_QUEUED_JOBS``.
    """
    check_slug(slug)
    if gpu_quota < 0:
        raise TenancyError("gpu quota must be zero or more")
    if max_queued_jobs is not None and max_queued_jobs < 0:
        raise TenancyError("the cap on waiting jobs must be zero or more")
    user_model = get_user_model()
    owner, created = user_model.objects.get_or_create(
        username=owner_username, defaults={"email": email}
    )
    if created:
        if password:
            owner.set_password(password)
        else:
            owner.set_unusable_password()
        owner.save()
    elif password:
        owner.set_password(password)
        owner.save(update_fields=["password"])
    cap = {} if max_queued_jobs is None else {"max_queued_jobs": max_queued_jobs}
    tenant = Tenant.objects.create(
        slug=slug, name=name or slug, gpu_quota=gpu_quota, profile_jobs=profile_jobs, **cap
    )
    Membership.objects.create(user=owner, tenant=tenant, role=Role.OWNER)
    return TenantCreated(tenant=tenant, owner_created=created)


@transaction.atomic
def do_add_member(*, tenant: Tenant, user: AbstractBaseUser, role: str = Role.MEMBER) -> Membership:
    """Add ``user`` to ``tenant`` with ``role`` (or change the role of an existing member)."""
    if role not in Role.values:
        raise TenancyError(f"unknown role {role!r} (known: {', '.join(Role.values)})")
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    return membership


@transaction.atomic
def do_remove_member(*, tenant: Tenant, user: AbstractBaseUser) -> bool:
    """Take ``user`` out of ``tenant`` (True if they were a member).

    Their open live sockets drop the tenant's topics once this commits (``tenancy.signals``).
    """
    deleted, _ = Membership.objects.filter(tenant=tenant, user_id=user.pk).delete()
    return deleted > 0


def can_write(user: AbstractBaseUser | AnonymousUser, tenant: Tenant) -> bool:
    """Whether ``user`` may submit or change jobs in ``tenant``."""
    if not user.is_authenticated:
        return False
    if getattr(user, "is_staff", False):
        return True
    return Membership.objects.filter(user_id=user.pk, tenant=tenant, role__in=WRITE_ROLES).exists()


def resolve_tenant_for_write(user: AbstractBaseUser | AnonymousUser, slug: str | None) -> Tenant:
    """The tenant a new job goes to: the named one, or the user's only writable tenant.

    Raises ``TenancyError`` with a message the API shows as-is.
    """
    return choose_tenant(Tenant.objects.writable_by(user), slug, "submit jobs")


def choose_tenant(tenants: QuerySet[Tenant], slug: str | None, doing: str) -> Tenant:
    """The tenant named ``slug`` among ``tenants``, or the only one; ``TenancyError`` if none.

    ``doing`` completes the messages: "you cannot <doing> in tenant 'x'".
    """
    if slug:
        tenant = tenants.filter(slug=slug).first()
        if tenant is None:
            raise TenancyError(f"you cannot {doing} in tenant {slug!r}")
        return tenant
    choices = list(tenants[:2])
    if not choices:
        raise TenancyError(f"you belong to no tenant in which you may {doing}")
    if len(choices) > 1:
        raise TenancyError("you belong to several tenants: say which one in 'tenant'")
    return choices[0]
