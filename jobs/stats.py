"""Job completion time statistics: a pure summary plus the queries that feed it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Avg,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    QuerySet,
)
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Extract


@dataclass(frozen=True)
class JctStats:
    """Summary of job completion times in seconds (None where there are no jobs)."""

    count: int
    mean: float | None
    median: float | None
    p95: float | None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be between 0 and 100")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    frac = pos - lo
    return sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac


def summarize(jcts: Sequence[float]) -> JctStats:
    """Mean, median and p95 of ``jcts``."""
    if not jcts:
        return JctStats(count=0, mean=None, median=None, p95=None)
    values = sorted(jcts)
    return JctStats(
        count=len(values),
        mean=sum(values) / len(values),
        median=percentile(values, 50.0),
        p95=percentile(values, 95.0),
    )


def _completed(jobs: QuerySet[Any], since: datetime | None) -> QuerySet[Any]:
    from jobs.choices import JobState

    finished = jobs.filter(state=JobState.COMPLETED, finished_at__isnull=False)
    if since is not None:
        finished = finished.filter(finished_at__gte=since)
    return finished


def _jct() -> ExpressionWrapper[CombinedExpression]:
    return ExpressionWrapper(F("finished_at") - F("submitted_at"), output_field=DurationField())


def completed_jcts(jobs: QuerySet[Any], since: datetime | None = None) -> list[float]:
    """JCTs (seconds) of the completed jobs in ``jobs``, optionally finished after ``since``."""
    # The database subtracts: one duration per row to read instead of two timestamps.
    rows = _completed(jobs, since).annotate(jct=_jct()).values_list("jct", flat=True)
    return [d.total_seconds() for d in rows]


class _PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(q) WITHIN GROUP (ORDER BY x)``: :func:`percentile`'s rule."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def jct_stats(jobs: QuerySet[Any], since: datetime | None = None) -> JctStats:
    """:func:`summarize` of :func:`completed_jcts`, aggregated by the database where it can.

    On PostgreSQL one row comes back however many jobs completed (a tenant's
    summary is remade at each of its completions, and its history only grows);
    elsewhere the durations are read and summarised here.
    """
    if connection.vendor != "postgresql":
        return summarize(completed_jcts(jobs, since))
    finished = _completed(jobs, since)
    seconds = Extract(_jct(), "epoch")
    row = finished.aggregate(
        count=Count("pk"),
        mean=Avg(seconds),
        median=_PercentileCont(seconds, fraction=0.5),
        p95=_PercentileCont(seconds, fraction=0.95),
    )
    if not row["count"]:
        return JctStats(count=0, mean=None, median=None, p95=None)
    return JctStats(
        count=row["count"],
        mean=float(row["mean"]),
        median=float(row["median"]),
        p95=float(row["p95"]),
    )
