"""The audit log's filters: shared by ``/api/v1/audit/``, ``/audit/`` and its CSV export.

The filters, all optional: ``tenant`` (slug), ``actor`` (user name), ``action``
(``job.cancel``, or a prefix ending in a dot: ``job.``), ``since`` and ``until``
(ISO 8601 times or dates, inclusive; a time without a zone is the portal's).

Who may read which rows is ``tenancy.audit_access``'s: it depends on who owns
which tenant, and ``tenancy`` sits above ``audit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from django import forms
from django.utils import timezone

from audit.models import AuditEntry, AuditQuerySet

FILTERS = ("tenant", "actor", "action", "since", "until")


def _plain(value: str) -> str:
    """Refuse NUL, which PostgreSQL refuses in a query (a 500 otherwise)."""
    if "\x00" in value:
        raise forms.ValidationError("May not contain NUL characters.")
    return value.strip()


def _text(placeholder: str) -> forms.TextInput:
    return forms.TextInput(attrs={"placeholder": placeholder, "size": 14})


class AuditFilterForm(forms.Form):
    """The audit log's filters, from a query string; every field is optional."""

    tenant = forms.CharField(
        required=False, max_length=50, help_text="Tenant slug.", widget=_text("slug")
    )
    actor = forms.CharField(
        required=False, max_length=150, help_text="User name, or system.", widget=_text("user")
    )
    action = forms.CharField(
        required=False,
        max_length=50,
        help_text="e.g. job.cancel, or job. for every job action.",
        widget=_text("job.cancel or job."),
    )
    since = forms.CharField(
        required=False,
        max_length=40,
        help_text="ISO 8601 time or date (inclusive).",
        widget=_text("2026-12-01"),
    )
    until = forms.CharField(
        required=False,
        max_length=40,
        help_text="ISO 8601 time or date (inclusive).",
        widget=_text("2026-12-31"),
    )

    def clean_tenant(self) -> str:
        return _plain(self.cleaned_data["tenant"])

    def clean_actor(self) -> str:
        return _plain(self.cleaned_data["actor"])

    def clean_action(self) -> str:
        return _plain(self.cleaned_data["action"])

    def clean_since(self) -> datetime | None:
        return _moment(_plain(self.cleaned_data["since"]), end_of_day=False)

    def clean_until(self) -> datetime | None:
        return _moment(_plain(self.cleaned_data["until"]), end_of_day=True)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since is not None and until is not None and since > until:
            self.add_error("until", "Must not be before since.")
        return cleaned


def _moment(text: str, *, end_of_day: bool) -> datetime | None:
    """An aware datetime from ISO text; a bare date is its first (or last) moment."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise forms.ValidationError(
            "Not an ISO 8601 time or date (e.g. 2026-12-01 or 2026-12-01T13:00:00Z)."
        ) from None
    if len(text) <= len("2026-12-01") and end_of_day:
        moment = datetime.combine(moment.date(), time.max)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    return moment


@dataclass(frozen=True)
class AuditFilters:
    """Checked filters (empty: not asked for)."""

    tenant: str = ""
    actor: str = ""
    action: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def from_form(cls, form: AuditFilterForm) -> AuditFilters:
        """The filters of a valid form."""
        data = form.cleaned_data
        return cls(
            tenant=data.get("tenant") or "",
            actor=data.get("actor") or "",
            action=data.get("action") or "",
            since=data.get("since"),
            until=data.get("until"),
        )

    def apply(self, rows: AuditQuerySet) -> AuditQuerySet:
        """``rows`` narrowed by these filters, newest first."""
        if self.tenant:
            rows = rows.filter(tenant_slug=self.tenant)
        if self.actor:
            rows = rows.filter(actor_name=self.actor)
        if self.action.endswith("."):
            rows = rows.filter(action__startswith=self.action)
        elif self.action:
            rows = rows.filter(action=self.action)
        if self.since is not None:
            rows = rows.filter(at__gte=self.since)
        if self.until is not None:
            rows = rows.filter(at__lte=self.until)
        return rows.order_by("-at", "-id")


def changes(entry: AuditEntry) -> list[tuple[str, Any, Any]]:
    """``(field, before, after)`` of a row, for the table and the CSV (missing side: None)."""
    before = entry.before if isinstance(entry.before, dict) else {}
    after = entry.after if isinstance(entry.after, dict) else {}
    names = list(dict.fromkeys([*before, *after]))
    return [(name, before.get(name), after.get(name)) for name in names]
