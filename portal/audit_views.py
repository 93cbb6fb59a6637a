"""``/audit/``: the audit log as a filtered, paginated table, and its CSV export.

Who sees what is ``tenancy.audit_access``'s and the filters ``audit.query``'s (the
API's too): cluster admins every row, tenant owners their tenants' rows, anybody
else 403.
The export streams at most ``EXPORT_MAX_ROWS`` rows, newest first.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from audit.models import AuditEntry, AuditQuerySet
from audit.query import FILTERS, AuditFilterForm, AuditFilters, changes
from tenancy.audit_access import readable_audit

PAGE_SIZE = 50
EXPORT_MAX_ROWS = 50_000
"""The CSV export's bound: narrow the filters for more (the response says it was cut)."""
EXPORT_CHUNK = 500
CSV_COLUMNS = (
    "at",
    "actor",
    "actor_id",
    "via",
    "client_address",
    "tenant",
    "action",
    "object_type",
    "object_id",
    "object",
    "before",
    "after",
)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _rows(request: HttpRequest) -> AuditQuerySet:
    """The rows the user may read, or 403."""
    rows = readable_audit(request.user)
    if rows is None:
        raise PermissionDenied("Only cluster admins and tenant owners read the audit log.")
    return rows


def _query(form: AuditFilterForm, **extra: Any) -> str:
    """The filters as a query string (as typed), with ``extra`` parameters."""
    params = {name: form.data.get(name, "") for name in FILTERS if form.data.get(name)}
    params.update({k: v for k, v in extra.items() if v})
    return urlencode(params)


@login_required
@require_GET
def audit_list(request: HttpRequest) -> HttpResponse:
    """The audit log's table with its filters; bad filters are shown on the form (400)."""
    rows = _rows(request)
    form = AuditFilterForm(request.GET)
    valid = form.is_valid()
    entries = AuditFilters.from_form(form).apply(rows) if valid else rows.none()
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page": page,
        "lines": [(entry, changes(entry)) for entry in page.object_list],
        "csv_url": f"{reverse('audit-export')}?{_query(form)}",
        "prev_url": f"?{_query(form, page=page.previous_page_number())}"
        if page.has_previous()
        else "",
        "next_url": f"?{_query(form, page=page.next_page_number())}" if page.has_next() else "",
    }
    return render(request, "audit/list.html", context, status=200 if valid else 400)


class _Echo:
    """A file-like sink that hands back what ``csv.writer`` writes (for streaming)."""

    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> str:
    """A CSV cell a spreadsheet shows as text: no leading ``=``, ``+``, ``-``, ``@`` formulas."""
    text = "" if value is None else str(value)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def _csv_line(entry: AuditEntry) -> list[str]:
    return [
        _cell(value)
        for value in (
            entry.at.isoformat(),
            entry.actor_name,
            entry.actor_id,
            entry.via,
            entry.client_address,
            entry.tenant_slug,
            entry.action,
            entry.object_type,
            entry.object_id,
            entry.object_repr,
            json.dumps(entry.before, sort_keys=True),
            json.dumps(entry.after, sort_keys=True),
        )
    ]


def csv_lines(entries: AuditQuerySet, total: int) -> Iterator[str]:
    """The CSV text of ``entries`` (at most ``EXPORT_MAX_ROWS``), one line at a time."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries[:EXPORT_MAX_ROWS].iterator(chunk_size=EXPORT_CHUNK):
        yield writer.writerow(_csv_line(entry))
    if total > EXPORT_MAX_ROWS:
        yield writer.writerow([f"# cut at {EXPORT_MAX_ROWS} of {total} rows: narrow the filters"])


@login_required
@require_GET
def audit_export(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """The filtered audit log as CSV, newest first, streamed and bounded."""
    rows = _rows(request)
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        lines = [f"{field}: {message}" for field, errs in form.errors.items() for message in errs]
        return HttpResponse("\n".join(lines), status=400, content_type="text/plain")
    entries = AuditFilters.from_form(form).apply(rows)
    total = entries.count()
    response = StreamingHttpResponse(csv_lines(entries, total), content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    response["X-Audit-Rows"] = str(min(total, EXPORT_MAX_ROWS))
    if total > EXPORT_MAX_ROWS:
        response["X-Audit-Truncated"] = str(total)
    return response


urlpatterns = [
    path("", audit_list, name="audit"),
    path("export.csv", audit_export, name="audit-export"),
]
"""Included at ``/audit/`` by ``portal.urls`` (one route group)."""
