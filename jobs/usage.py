"""Usage accounting: the GPU-seconds each job *held*, from its parallelism history.

Attained service (``Job.attained_gpu_seconds``) is what the scheduler ranks by
and skips long gaps between reports; this is the billing-grade count: every
second a job held ``n`` GPUs counts ``n`` GPU-seconds, whether it trained or
not.  The pipeline, pure from the events on::

    JobEvent rows with from/to parallelism        Job.parallelism (now)
            │                                            │
            └──► changes_from_events() ◄─────────────────┘
                        │  [Change(at, gpus)]  (0 GPUs before the first)
                        ▼
                 held_intervals(since, until)  ──►  [Held(start, end, gpus)]
                        │                                     │
            split_by_day() (UTC)                  decayed_gpu_seconds(now, H)
                        │                                     │
         UsageRow(job, user, tenant, day, s)      decayed_usage_by_tenant()
                        │                          (the scheduler's fair share)
                   roll_up(group_by)  ──► API JSON/CSV, the Usage pages, /metrics

Which value holds between two events: the ``from_parallelism`` of the later
one.  Every writer of a parallelism event records the job's true parallelism
before it as ``from`` (``jobs.lifecycle.transition``, ``do_set_parallelism``,
the tick's lost-GPU recovery, a runtime ``recovered`` report), while a
runtime ``recovered`` report's ``to`` is the runtime's claim, applied only
when the control plane agrees (then a ``scaled`` event follows at once).
After the last event the job holds ``Job.parallelism``.

The queries at the bottom read only jobs that ran within the asked range and
only their parallelism events, in two queries whatever the number of jobs.
The all-time counter (``gpu_seconds_by_tenant``, for ``/metrics``) is one
aggregate query instead, through the telescoping sum its docstring derives;
it leaves out the runtime's claims (``RUNTIME_CLAIM``) where the row-by-row
path reads ``from`` instead, and a test checks that both give the same seconds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet, Sum, Value

from jobs.choices import EventKind
from jobs.models import Job, JobEvent
from scheduler.gpu_types import GpuType, parse_type_numbers, weighted_gpu_seconds

MAX_RANGE = timedelta(days=366)
"""The longest range one usage query may cover."""
DEFAULT_RANGE = timedelta(days=30)
"""The range when ``since`` is not given: the 30 days before ``until``."""
DECAY_HORIZON_HALF_LIVES = 10
"""Fair share reads only the last 10 half-lives: older seconds weigh under 1/1024."""
GROUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "day": ("day",),
    "user": ("user",),
    "job": ("job", "job_name", "tenant", "user"),
    "tenant": ("tenant",),
}
"""What a row of each ``group_by`` is keyed by (its first columns in JSON and CSV)."""
VALUE_COLUMNS = ("gpu_seconds", "gpu_hours")


# --- Pure core -------------------------------------------------------------------------


class ParallelismEvent(NamedTuple):
    """One history event that records a job's parallelism before and after it."""

    at: datetime
    from_parallelism: int
    to_parallelism: int | None


@dataclass(frozen=True)
class Change:
    """From ``at`` on, the job holds ``gpus`` GPUs (until the next change)."""

    at: datetime
    gpus: int


@dataclass(frozen=True)
class Held:
    """``gpus`` GPUs held over ``[start, end)``."""

    start: datetime
    end: datetime
    gpus: int

    @property
    def gpu_seconds(self) -> float:
        """GPUs times seconds of the interval."""
        return self.gpus * (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class UsageRow:
    """GPU-seconds one job held on one UTC day (within the asked range)."""

    job: int
    job_name: str
    tenant: str
    user: str
    day: date
    gpu_seconds: float
    gpu_type: str = ""  # the type it ran on (``Job.ran_on_type``; "" before types were kept)


class UsageRangeError(ValueError):
    """A usage query's range or grouping is refused; ``field`` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def changes_from_events(events: Sequence[ParallelismEvent], current: int) -> list[Change]:
    """What a job held over time, from its parallelism events in order and what it holds now.

    Between two events the job held what the later one says it held before
    (``from_parallelism``); after the last, ``current``.  Equal neighbours merge.
    """
    changes: list[Change] = []
    for index, event in enumerate(events):
        after = events[index + 1].from_parallelism if index + 1 < len(events) else current
        if changes and changes[-1].gpus == after:
            continue
        changes.append(Change(event.at, after))
    return changes


def held_intervals(changes: Sequence[Change], *, since: datetime, until: datetime) -> list[Held]:
    """The intervals in ``[since, until)`` over which the job held one or more GPUs.

    It holds nothing before its first change; each change lasts until the next
    one, the last until ``until``.  Changes must be in time order.
    """
    held: list[Held] = []
    for index, change in enumerate(changes):
        if index and change.at < changes[index - 1].at:
            raise ValueError("changes must be in time order")
        following = changes[index + 1].at if index + 1 < len(changes) else until
        start, end = max(change.at, since), min(following, until)
        if change.gpus > 0 and end > start:
            held.append(Held(start, end, change.gpus))
    return held


def split_by_day(intervals: Iterable[Held]) -> dict[date, float]:
    """GPU-seconds of ``intervals`` per UTC day (a day runs from midnight to midnight UTC)."""
    by_day: dict[date, float] = defaultdict(float)
    for interval in intervals:
        cursor = interval.start.astimezone(UTC)
        end = interval.end.astimezone(UTC)
        while cursor < end:
            midnight = datetime.combine(cursor.date() + timedelta(days=1), time(), tzinfo=UTC)
            piece_end = min(end, midnight)
            by_day[cursor.date()] += interval.gpus * (piece_end - cursor).total_seconds()
            cursor = piece_end
    return dict(by_day)


def decayed_gpu_seconds(intervals: Iterable[Held], *, now: datetime, half_life_s: float) -> float:
    """GPU-seconds held, each second at ``t`` weighted ``2^(-(now - t) / half_life_s)``.

    Integrated exactly: over ``[a, b]`` the weight integrates to
    ``H/ln 2 * (2^(-(now-b)/H) - 2^(-(now-a)/H))``.  Seconds after ``now`` do not count.
    """
    if half_life_s <= 0:
        raise ValueError("the half-life must be positive")
    rate = math.log(2) / half_life_s
    total = 0.0
    for interval in intervals:
        end = min(interval.end, now)
        if end <= interval.start:
            continue
        age_end = (now - end).total_seconds()
        length = (end - interval.start).total_seconds()
        # exp(-r*age_end) - exp(-r*(age_end+length)), without cancellation for short spans.
        total += interval.gpus * math.exp(-rate * age_end) * -math.expm1(-rate * length) / rate
    return total


def roll_up(rows: Iterable[UsageRow], group_by: str) -> list[dict[str, Any]]:
    """Totals of ``rows`` per ``group_by`` key, in key order, with GPU-hours beside seconds.

    Seconds are rounded to the millisecond and hours to 6 places *after* summing,
    so every output (JSON, CSV, page, metrics) shows the same figures.
    """
    if group_by not in GROUP_COLUMNS:
        raise UsageRangeError("group_by", f"Must be one of {', '.join(GROUP_COLUMNS)}.")
    columns = GROUP_COLUMNS[group_by]
    totals: dict[tuple[Any, ...], float] = defaultdict(float)
    for row in rows:
        values: dict[str, Any] = {"day": row.day.isoformat(), "user": row.user}
        values.update({"tenant": row.tenant, "job": row.job, "job_name": row.job_name})
        totals[tuple(values[c] for c in columns)] += row.gpu_seconds
    return [
        {**dict(zip(columns, key, strict=True)), **_amounts(seconds)}
        for key, seconds in sorted(totals.items())
    ]


def gpu_type_weights() -> dict[str, GpuType]:
    """The admin's weight per GPU type (``GPU_TYPE_WEIGHTS``: ``h100-80g:2,a100-40g:1``; a
    type not named weighs 1): what one of its GPU-hours counts in fair share and usage."""
    text = str(settings.GPU_TYPE_WEIGHTS or "").strip()
    if not text:
        return {}
    return {
        name: GpuType(name, weight=weight)
        for name, weight in parse_type_numbers(text, "GPU_TYPE_WEIGHTS").items()
    }


def by_type(rows: Iterable[UsageRow]) -> list[dict[str, Any]]:
    """GPU-seconds and hours per GPU type, each with its weight and weighted figures
    (:func:`scheduler.gpu_types.weighted_gpu_seconds`), in type order."""
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        totals[row.gpu_type] += row.gpu_seconds
    types = gpu_type_weights()
    out = []
    for name, seconds in sorted(totals.items()):
        weighted = weighted_gpu_seconds({name: seconds}, types)
        weight = types[name].weight if name in types else 1.0
        out.append({"gpu_type": name, **_amounts(seconds), "weight": weight,
                    "weighted_gpu_hours": round(weighted / 3600, 6)})  # fmt: skip
    return out


def _amounts(seconds: float) -> dict[str, float]:
    return {"gpu_seconds": round(float(seconds), 3), "gpu_hours": round(seconds / 3600, 6)}


def check_range(
    since_raw: str | None, until_raw: str | None, *, now: datetime
) -> tuple[datetime, datetime]:
    """``[since, until)`` from ISO 8601 text (a date is its midnight UTC; naive is UTC).

    ``until`` defaults to ``now`` and ``since`` to 30 days before ``until``;
    ``since`` must come before ``until`` and the range may span at most 366 days.
    """
    until = _parse_instant("until", until_raw) if until_raw else now
    since = _parse_instant("since", since_raw) if since_raw else until - DEFAULT_RANGE
    if since >= until:
        raise UsageRangeError("since", "Must be before until.")
    if until - since > MAX_RANGE:
        raise UsageRangeError("until", f"The range may span at most {MAX_RANGE.days} days.")
    return since, until


def _parse_instant(field: str, raw: str) -> datetime:
    text = raw.strip()
    if len(text) > 40 or "\x00" in text:
        raise UsageRangeError(field, "Not an ISO 8601 date or time.")
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime.combine(day, time(), tzinfo=UTC)
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageRangeError(
            field, "Not an ISO 8601 date or time (2026-03-01 or 2026-03-01T12:00:00Z)."
        ) from None
    return instant.replace(tzinfo=UTC) if instant.tzinfo is None else instant.astimezone(UTC)


# --- Queries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobHolding:
    """One job's identity and the intervals over which it held GPUs."""

    job: int
    job_name: str
    tenant: str
    user: str
    intervals: tuple[Held, ...]
    gpu_type: str = ""

    @property
    def gpu_seconds(self) -> float:
        """All GPU-seconds of its intervals."""
        return sum(interval.gpu_seconds for interval in self.intervals)


def job_holdings(
    jobs: QuerySet[Job], *, since: datetime, until: datetime, now: datetime
) -> list[JobHolding]:
    """What each of ``jobs`` held within ``[since, min(until, now))``, read in two queries.

    Only jobs that started before the end and had not finished by ``since`` are read.
    """
    end = min(until, now)
    if end <= since:
        return []
    candidates = jobs.filter(started_at__isnull=False, started_at__lt=end).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gt=since)
    )
    jobs_read: list[Any] = list(
        candidates.order_by("pk").values_list(
            "pk",
            "name",
            "tenant__slug",
            "submitter__username",
            "parallelism",
            "ran_on_type",
            named=True,
        )
    )
    events: dict[int, list[ParallelismEvent]] = defaultdict(list)
    history = (
        JobEvent.objects.filter(job_id__in=candidates.values("pk"), from_parallelism__isnull=False)
        .order_by("job_id", "at", "id")
        .values_list("job_id", "at", "from_parallelism", "to_parallelism", named=True)
    )
    for event in history.iterator(chunk_size=2000):
        events[event.job_id].append(
            ParallelismEvent(event.at, event.from_parallelism or 0, event.to_parallelism)
        )
    holdings = []
    for row in jobs_read:
        changes = changes_from_events(events.get(row.pk, []), row.parallelism)
        intervals = held_intervals(changes, since=since, until=end)
        holdings.append(
            JobHolding(
                row.pk,
                row.name,
                row.tenant__slug,
                row.submitter__username,
                tuple(intervals),
                row.ran_on_type,
            )
        )
    return holdings


def usage_rows(holdings: Iterable[JobHolding]) -> list[UsageRow]:
    """One row per job and UTC day on which it held GPUs."""
    return [
        UsageRow(h.job, h.job_name, h.tenant, h.user, day, seconds, h.gpu_type)
        for h in holdings
        for day, seconds in sorted(split_by_day(h.intervals).items())
    ]


def usage_report(
    jobs: QuerySet[Job], *, since: datetime, until: datetime, now: datetime, group_by: str
) -> dict[str, Any]:
    """The usage of ``jobs`` in ``[since, until)`` rolled up by ``group_by``: the API's JSON."""
    if group_by not in GROUP_COLUMNS:
        raise UsageRangeError("group_by", f"Must be one of {', '.join(GROUP_COLUMNS)}.")
    rows = usage_rows(job_holdings(jobs, since=since, until=until, now=now))
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "group_by": group_by,
        "columns": [*GROUP_COLUMNS[group_by], *VALUE_COLUMNS],
        "total": _amounts(sum(row.gpu_seconds for row in rows)),
        "rows": roll_up(rows, group_by),
        "by_type": by_type(rows),
    }


def chart_data(
    jobs: QuerySet[Job], *, since: datetime, until: datetime, now: datetime, capacity_gpus: int
) -> dict[str, Any]:
    """What the Usage pages draw: per day and user, per user, per tenant, and the cluster's share.

    ``capacity_gpus`` GPUs over the range (up to now) is the cluster's capacity,
    the denominator of each tenant's share.
    """
    rows = usage_rows(job_holdings(jobs, since=since, until=until, now=now))
    elapsed = max(0.0, (min(until, now) - since).total_seconds())
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "total": _amounts(sum(row.gpu_seconds for row in rows)),
        "capacity_gpu_seconds": round(capacity_gpus * elapsed, 3),
        "by_day_user": _by_day_and_user(rows),
        "by_day": roll_up(rows, "day"),
        "by_user": roll_up(rows, "user"),
        "by_tenant": roll_up(rows, "tenant"),
    }


def _by_day_and_user(rows: Sequence[UsageRow]) -> list[dict[str, Any]]:
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        totals[(row.day.isoformat(), row.user)] += row.gpu_seconds
    return [
        {"day": day, "user": user, **_amounts(seconds)}
        for (day, user), seconds in sorted(totals.items())
    ]


RUNTIME_CLAIM = Q(kind=EventKind.RECOVERED, data__has_key="generation")
"""A runtime ``recovered`` report's event: its ``to`` is the runtime's claim, not a change
(when the control plane applies it, a ``scaled`` event records the change)."""


def gpu_seconds_by_tenant(*, now: datetime) -> dict[str, float]:
    """Every GPU-second ever held, per tenant slug, up to ``now``: one aggregate query.

    For the Prometheus counter, which must not read jobs row by row.  Along one
    job's history the GPUs held step by ``d_i = to_i - from_i`` at each change,
    from 0 to what it holds now, and each step lasts until now, so::

        held GPU-seconds = sum_i d_i * (now - at_i)

    The database sums ``now - at`` per tenant and ``d``; the rest is exact
    ``timedelta`` arithmetic.  Runtime claims (``RUNTIME_CLAIM``) are left out:
    they change nothing.  The same figures as :func:`job_holdings` (a test checks).
    """
    steps = (
        JobEvent.objects.filter(
            from_parallelism__isnull=False, to_parallelism__isnull=False, at__lte=now
        )
        .exclude(RUNTIME_CLAIM)
        .annotate(step=F("to_parallelism") - F("from_parallelism"))
        .exclude(step=0)
        .values("job__tenant__slug", "step")
        .annotate(ages=Sum(ExpressionWrapper(Value(now) - F("at"), output_field=DurationField())))
        .values_list("job__tenant__slug", "step", "ages", named=True)
        .order_by()
    )
    totals: dict[str, timedelta] = defaultdict(timedelta)
    for row in steps:
        totals[row.job__tenant__slug] += row.step * row.ages
    return {slug: total.total_seconds() for slug, total in totals.items()}


def decayed_usage_by_tenant(now: datetime, half_life_s: float) -> dict[str, float]:
    """Tenant slug -> GPU-seconds held, each second weighted by its age's half-lives and
    its GPU type's weight (``GPU_TYPE_WEIGHTS``).

    For the scheduler's fair share.  Reads only jobs active within the last
    ten half-lives (an older second weighs under 1/1024); a tenant with no such
    job is absent (its usage is 0).
    """
    if half_life_s <= 0:
        raise ValueError("the half-life must be positive")
    since = now - timedelta(seconds=half_life_s * DECAY_HORIZON_HALF_LIVES)
    types = gpu_type_weights()
    totals: dict[str, float] = defaultdict(float)
    for holding in job_holdings(Job.objects.all(), since=since, until=now, now=now):
        seconds = decayed_gpu_seconds(holding.intervals, now=now, half_life_s=half_life_s)
        totals[holding.tenant] += weighted_gpu_seconds({holding.gpu_type: seconds}, types)
    return dict(totals)
