"""What an admin may set on a tenant, and the checks a new value must pass.

The same rules as the model's fields and check constraints, said in words a
form or the API can show (``do_update_tenant`` refuses with them before the
database would refuse with an ``IntegrityError``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.gpu_types import TYPE_SLUG
from tenancy.errors import TenancyError

#: The largest value a ``PositiveIntegerField`` holds on every database we run on.
INT_MAX = 2_147_483_647
NAME_MAX = 100


@dataclass(frozen=True)
class Setting:
    """One tenant field an admin may set: its kind, whether it may be empty, its least value."""

    kind: type  # int, float, bool, str, or dict (GPUs per GPU type)
    nullable: bool = False
    minimum: float = 0


#: The tenant fields ``do_update_tenant`` changes (slug and creation time never change).
SETTINGS: dict[str, Setting] = {
    "name": Setting(str),
    "gpu_quota": Setting(int),
    "priority_weight": Setting(float),
    "profile_jobs": Setting(bool),
    "max_queued_jobs": Setting(int),
    "artifact_retention_days": Setting(int, nullable=True, minimum=1),
    "log_retention_days": Setting(int, nullable=True, minimum=1),
    "default_max_restarts": Setting(int),
    "max_restarts_ceiling": Setting(int, nullable=True),
    "default_max_runtime_s": Setting(int, nullable=True, minimum=1),
    "max_runtime_ceiling_s": Setting(int, nullable=True, minimum=1),
    "max_token_days": Setting(int, nullable=True, minimum=1),
    "gpu_type_quota": Setting(dict),
    "default_cpus_per_gpu": Setting(int),
    "default_mem_per_gpu_mib": Setting(int),
    "default_session_idle_s": Setting(int, minimum=1),
    "session_idle_ceiling_s": Setting(int, minimum=1),
    "default_session_lifetime_s": Setting(int, minimum=1),
    "session_lifetime_ceiling_s": Setting(int, minimum=1),
    "session_home_quota_mib": Setting(int),
}

#: Settings a form may leave blank (or out), and the value blank means: none asked.
UNSET_DEFAULTS: dict[str, Any] = {
    "gpu_type_quota": {},
    "default_cpus_per_gpu": 0,
    "default_mem_per_gpu_mib": 0,
}


def fill_unset(fields: dict[str, Any]) -> None:
    """Give the settings of :data:`UNSET_DEFAULTS` left blank on a form their meaning."""
    for name, default in UNSET_DEFAULTS.items():
        if name in fields and fields[name] in (None, ""):
            fields[name] = type(default)()


MAX_QUOTA_TYPES = 32

#: (default, ceiling) pairs: a default must not exceed its ceiling when both are set.
WITHIN_CEILING = (
    ("default_max_restarts", "max_restarts_ceiling"),
    ("default_max_runtime_s", "max_runtime_ceiling_s"),
    ("default_session_idle_s", "session_idle_ceiling_s"),
    ("default_session_lifetime_s", "session_lifetime_ceiling_s"),
)


def check_value(name: str, value: Any) -> Any:
    """``value`` for the setting ``name`` if it is allowed, else ``TenancyError`` naming it."""
    setting = SETTINGS.get(name)
    if setting is None:
        known = ", ".join(SETTINGS)
        raise TenancyError(f"{str(name)[:50]!r} is not a tenant setting (known: {known})")
    if value is None:
        if setting.nullable:
            return None
        raise TenancyError(f"{name}: a value is required")
    if setting.kind is bool:
        if not isinstance(value, bool):
            raise TenancyError(f"{name}: must be true or false")
        return value
    if setting.kind is dict:
        return check_type_quota(name, value)
    if setting.kind is str:
        text = value.strip() if isinstance(value, str) else ""
        if not text or len(text) > NAME_MAX:
            raise TenancyError(f"{name}: must be 1 to {NAME_MAX} characters")
        return text
    # Numbers: a bool is an int to Python but never a count or a weight.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TenancyError(f"{name}: must be a number")
    if setting.kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise TenancyError(f"{name}: must be a whole number")
        number: float = int(value)
    else:
        number = float(value)
        if not math.isfinite(number):
            raise TenancyError(f"{name}: must be a finite number")
    if number < setting.minimum:
        least = "zero" if setting.minimum == 0 else f"{setting.minimum:g}"
        raise TenancyError(f"{name}: must be {least} or more")
    if number > INT_MAX:
        raise TenancyError(f"{name}: must be at most {INT_MAX}")
    return number


def check_type_quota(name: str, value: Any) -> dict[str, int]:
    """A quota per GPU type: type slug -> a whole number of GPUs from 0 to ``INT_MAX``."""
    if not isinstance(value, Mapping) or len(value) > MAX_QUOTA_TYPES:
        raise TenancyError(
            f"{name}: must be an object of GPU type -> GPUs (at most {MAX_QUOTA_TYPES} types)"
        )
    quota: dict[str, int] = {}
    for slug, gpus in value.items():
        if not isinstance(slug, str) or not TYPE_SLUG.fullmatch(slug):
            raise TenancyError(
                f"{name}: {str(slug)[:40]!r} is no GPU type (1-32 of a-z, 0-9, '.', '_', '-')"
            )
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= INT_MAX:
            raise TenancyError(f"{name}.{slug}: must be a whole number of GPUs, 0 or more")
        quota[slug] = gpus
    return quota


def check_settings(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The checked ``changes`` to a tenant whose settings are ``current``.

    Each value is checked alone (``check_value``), then the pairs a default and its
    ceiling form are checked on the result, so a change that lowers a ceiling
    under the current default is refused with both named.
    """
    checked = {name: check_value(name, value) for name, value in changes.items()}
    merged = {**current, **checked}
    for default, ceiling in WITHIN_CEILING:
        low, high = merged.get(default), merged.get(ceiling)
        if low is not None and high is not None and low > high:
            raise TenancyError(f"{default} ({low}) must not exceed {ceiling} ({high})")
    return checked
