"""Tenancy services: every write to tenants and members goes through here.

Each change records one audit row in its own transaction (``audit.services.record``):

    do_create_tenant   tenant.create      the settings and the owner
    do_update_tenant   tenant.update      only the fields that changed
    do_add_member      membership.add     user and role
    do_change_role     membership.role    the role before and after
    do_remove_member   membership.remove  user and the role they had

Who may do what (``by``, the acting user; ``None`` for the portal itself: a
command, a fixture): cluster admins everything; a tenant's owners manage its
members; nobody removes or demotes the last owner.  Every membership change
locks the tenant's row first, so two owners demoting each other at once cannot
both succeed.  API tokens have their own services: ``tenancy.token_services``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils.text import slugify

from audit.services import changed, record, snapshot
from tenancy.errors import TenancyError as TenancyError
from tenancy.errors import TenancyPermissionError as TenancyPermissionError
from tenancy.models import WRITE_ROLES, Membership, Role, Tenant
from tenancy.tenant_settings import SETTINGS, check_settings

#: Longest username or email an invitation may name (Django's email field holds 254).
IDENTIFIER_MAX = 254


@dataclass(frozen=True)
class TenantCreated:
    """What ``do_create_tenant`` made."""

    tenant: Tenant
    owner_created: bool


def check_slug(slug: str) -> str:
    """Return ``slug`` if it is a valid, unused tenant slug."""
    if not slug or slugify(slug) != slug or len(slug) > 50:
        raise TenancyError(
            f"invalid tenant slug {str(slug)[:60]!r}: use lowercase letters, digits and hyphens (max 50)"
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


def _settings_of(tenant: Tenant) -> dict[str, Any]:
    return snapshot(tenant, SETTINGS)


def _locked(tenant: Tenant) -> Tenant:
    """``tenant`` read again with its row locked until the transaction ends."""
    return Tenant.objects.select_for_update().get(pk=tenant.pk)


def role_of(user: AbstractBaseUser | AnonymousUser, tenant: Tenant) -> str | None:
    """``user``'s role in ``tenant``, or None when they are not a member."""
    if not user.is_authenticated:
        return None
    role: str | None = (
        Membership.objects.filter(user_id=user.pk, tenant=tenant)
        .values_list("role", flat=True)
        .first()
    )
    return role


def can_manage_members(user: AbstractBaseUser | AnonymousUser, tenant: Tenant) -> bool:
    """Whether ``user`` may add, change and remove ``tenant``'s members: an owner or an admin."""
    if not user.is_authenticated:
        return False
    if getattr(user, "is_staff", False):
        return True
    return role_of(user, tenant) == Role.OWNER


def _check_manager(by: Any, tenant: Tenant) -> None:
    if by is not None and not can_manage_members(by, tenant):
        raise TenancyPermissionError(f"only an owner of {tenant.slug!r} may change its members")


def _check_admin(by: Any) -> None:
    if by is not None and not (by.is_authenticated and getattr(by, "is_staff", False)):
        raise TenancyPermissionError("only a cluster admin may create or configure tenants")


def check_role(role: object) -> Role:
    """``role`` as a ``Role``, or ``TenancyError`` listing the known ones."""
    if not isinstance(role, str) or role not in Role.values:
        shown = str(role)[:50]
        raise TenancyError(f"unknown role {shown!r} (known: {', '.join(Role.values)})")
    return Role(role)


def find_user(identifier: str) -> Any:
    """The active user whose username is ``identifier``, or whose email it is (no one else).

    An email that several accounts share names nobody: the username must be used.
    """
    text = identifier.strip() if isinstance(identifier, str) else ""
    if not text or len(text) > IDENTIFIER_MAX:
        raise TenancyError(f"give a username or an email (1 to {IDENTIFIER_MAX} characters)")
    users = get_user_model().objects.filter(is_active=True)
    user = users.filter(username=text).first()
    if user is not None:
        return user
    if "@" in text:
        matches = list(users.filter(email__iexact=text)[:2])
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise TenancyError("several users have that email: give the username instead")
    raise TenancyError(f"no user {text[:80]!r}: invite an existing user by username or email")


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
    priority_weight: float = 1.0,
    create_owner: bool = True,
    by: Any = None,
) -> TenantCreated:
    """Create a tenant and make ``owner_username`` its owner.

    The owner user is created when missing if ``create_owner`` (the
    ``createtenant`` command); the portal's pages and API pass False and name an
    existing user.  ``max_queued_jobs`` defaults to ``DEFAULT_TENANT_MAX_QUEUED_JOBS``.
    Records ``tenant.create`` with the new settings and the owner.
    """
    _check_admin(by)
    check_slug(slug)
    values: dict[str, Any] = {
        "name": name or slug,
        "gpu_quota": gpu_quota,
        "priority_weight": priority_weight,
        "profile_jobs": profile_jobs,
    }
    if max_queued_jobs is not None:
        values["max_queued_jobs"] = max_queued_jobs
    values = check_settings({}, values)
    user_model = get_user_model()
    if create_owner:
        owner, created = user_model.objects.get_or_create(
            username=owner_username, defaults={"email": email}
        )
    else:
        owner, created = find_user(owner_username), False
    if created:
        if password:
            owner.set_password(password)
        else:
            owner.set_unusable_password()
        owner.save()
    elif password:
        owner.set_password(password)
        owner.save(update_fields=["password"])
    tenant = Tenant.objects.create(slug=slug, **values)
    Membership.objects.create(user=owner, tenant=tenant, role=Role.OWNER)
    after = {"slug": slug, **_settings_of(tenant), "owner": owner.get_username()}
    record("tenant.create", obj=tenant, tenant=tenant, after=after, user=by)
    return TenantCreated(tenant=tenant, owner_created=created)


@transaction.atomic
def do_update_tenant(tenant: Tenant, *, by: Any = None, **fields: Any) -> Tenant:
    """Change ``tenant``'s settings (``tenancy.tenant_settings.SETTINGS``): admins only.

    Values are checked as the model's constraints would (``TenancyError`` naming
    the field otherwise); only the fields that change are written and recorded
    (``tenant.update``).  Nothing changing writes nothing.  Returns the tenant as stored.
    """
    _check_admin(by)
    locked = _locked(tenant)
    current = _settings_of(locked)
    checked = check_settings(current, fields)
    before, after = changed(current, {**current, **checked})
    if not after:
        return locked
    for name, value in after.items():
        setattr(locked, name, value)
    locked.save(update_fields=list(after))
    record("tenant.update", obj=locked, tenant=locked, before=before, after=after, user=by)
    return locked


def _member_fields(user: AbstractBaseUser, role: str | None) -> dict[str, Any]:
    return {"user_id": user.pk, "username": user.get_username(), "role": role}


def _check_owner_stays(tenant: Tenant, membership: Membership, new_role: str | None) -> None:
    """Refuse to leave ``tenant`` without an owner (``new_role`` None = removed)."""
    if membership.role != Role.OWNER or new_role == Role.OWNER:
        return
    owners = Membership.objects.filter(tenant=tenant, role=Role.OWNER).count()
    if owners <= 1:
        doing = "remove" if new_role is None else "demote"
        raise TenancyError(
            f"cannot {doing} {membership.user.get_username()!r}: they are the last owner of "
            f"{tenant.slug!r} (make another member an owner first)"
        )


def _membership(tenant: Tenant, user: AbstractBaseUser) -> Membership:
    found = Membership.objects.select_related("user").filter(tenant=tenant, user_id=user.pk).first()
    if found is None:
        raise TenancyError(f"{user.get_username()!r} is not a member of {tenant.slug!r}")
    return found


@transaction.atomic
def do_add_member(
    *, tenant: Tenant, user: AbstractBaseUser, role: str = Role.MEMBER, by: Any = None
) -> Membership:
    """Add ``user`` to ``tenant`` with ``role`` (``membership.add``).

    For an existing member this changes their role instead (``do_change_role``,
    with its rules); ``do_invite_member`` refuses one.
    """
    checked = check_role(role)
    locked = _locked(tenant)
    _check_manager(by, locked)
    if Membership.objects.filter(tenant=locked, user_id=user.pk).exists():
        return do_change_role(tenant=locked, user=user, role=checked, by=by)
    membership = Membership.objects.create(user_id=user.pk, tenant=locked, role=checked)
    record(
        "membership.add",
        obj=membership,
        tenant=locked,
        after=_member_fields(user, checked),
        user=by,
    )
    return membership


@transaction.atomic
def do_invite_member(*, tenant: Tenant, identifier: str, role: str, by: Any) -> Membership:
    """Add the existing user named by ``identifier`` (username or email) to ``tenant``.

    No user is ever created here; an existing member is refused (change their role).
    """
    checked = check_role(role)
    _check_manager(by, tenant)
    user = find_user(identifier)
    if Membership.objects.filter(tenant=tenant, user_id=user.pk).exists():
        raise TenancyError(
            f"{user.get_username()!r} is already a member of {tenant.slug!r}: change their role"
        )
    return do_add_member(tenant=tenant, user=user, role=checked, by=by)


@transaction.atomic
def do_change_role(
    *, tenant: Tenant, user: AbstractBaseUser, role: str, by: Any = None
) -> Membership:
    """Give member ``user`` of ``tenant`` the role ``role`` (``membership.role``).

    The last owner cannot be demoted.  The same role again writes nothing.
    """
    checked = check_role(role)
    locked = _locked(tenant)
    _check_manager(by, locked)
    membership = _membership(locked, user)
    if membership.role == checked:
        return membership
    _check_owner_stays(locked, membership, checked)
    before = _member_fields(user, membership.role)
    membership.role = checked
    membership.save(update_fields=["role"])
    after = _member_fields(user, checked)
    record("membership.role", obj=membership, tenant=locked, before=before, after=after, user=by)
    return membership


@transaction.atomic
def do_remove_member(*, tenant: Tenant, user: AbstractBaseUser, by: Any = None) -> bool:
    """Take ``user`` out of ``tenant`` (True if they were a member): ``membership.remove``.

    The last owner cannot be removed.  Their open live sockets drop the tenant's
    topics once this commits (``tenancy.signals``).
    """
    locked = _locked(tenant)
    _check_manager(by, locked)
    membership = (
        Membership.objects.select_related("user").filter(tenant=locked, user_id=user.pk).first()
    )
    if membership is None:
        return False
    _check_owner_stays(locked, membership, None)
    before = _member_fields(user, membership.role)
    # The row's id and name before it goes: the log keeps them, the table will not.
    object_id, object_repr = str(membership.pk), str(membership)
    membership.delete()
    record(
        "membership.remove",
        tenant=locked,
        before=before,
        user=by,
        object_type=Membership._meta.label_lower,
        object_id=object_id,
        object_repr=object_repr,
    )
    return True


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
