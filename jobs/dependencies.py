"""Jobs that wait for others: checking a submission's ``after``, and releasing or cancelling
a waiting job when what it waits for ends.

A job with dependencies (``JobDependency``: ``after_ok``, ``after_any``,
``after_failed`` on a job or a whole array of the same tenant) stays
``pending`` — the lifecycle's state before the queue, which the tick never
schedules — with ``wait_reason`` saying what it waits for.  The rule (met,
waiting, never) is ``scheduler.dependencies``'s; this module reads the states
it needs and moves the job::

    a job ends (any JobEvent whose to_state is terminal: the tick, a report,
    a person, an admin: jobs.workflow_events hears it in the same transaction)
      │
      ▼
    on_job_ended(job, array)
      ├─ every array with a pending task that waits on it, and the job's own
      │  array: fill_slots (array row locked first, then its pending tasks)
      └─ every other pending job that waits on it: locked, then settle
           settle(job): never met → cancelled, with the reason
                        waiting   → pending, wait_reason updated
                        met       → queued (an array task: only while its array
                                    has a free slot under max_running)
      (a job cancelled on the way is an end too: queued, worked off after this one)

Race safety: a waiting job is locked (``select_for_update``) before its
dependencies are read, so of two jobs ending at once in two transactions the
second to lock it sees the first's end; an array's slots are counted under
its row's lock, so two tasks ending at once never release more than the cap.
Settling a job that is no longer pending does nothing: the release is
idempotent.  A waiting job's dependencies may be replaced
(``PATCH /api/v1/jobs/{id}/`` with ``after``): ``check_no_cycle`` refuses
a set that would lead back to the job itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from jobs.choices import TERMINAL_STATES, DependencyKind, JobState
from jobs.lifecycle import broadcast, request_tick, save_fields, transition, update_jobs
from jobs.models import Job, JobArray, JobDependency
from scheduler.dependencies import KINDS, Outcome, combined, find_cycle, outcome, outcome_of_all
from tenancy.models import Tenant

MAX_DEPENDENCIES = 64
ACTIVE_TASK_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.SCALING)
"""An array task in one of these holds one of its array's ``max_running`` slots."""

_WAITING_FOR: dict[str, str] = {
    DependencyKind.AFTER_OK: "to complete",
    DependencyKind.AFTER_ANY: "to end",
    DependencyKind.AFTER_FAILED: "to fail",
}


@dataclass(frozen=True)
class After:
    """One checked dependency of a submission: a job or an array (exactly one) and a kind."""

    kind: str
    job_id: int | None = None
    array_id: int | None = None

    @property
    def target(self) -> str:
        """What it names, in words: ``job 12`` or ``array 3``."""
        return f"job {self.job_id}" if self.job_id is not None else f"array {self.array_id}"


def _positive_id(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _parse(raw: Any, add_error: Callable[[str, str], None]) -> list[tuple[str, After]]:
    """The dependencies as sent, each with its field name (``after[0]``); shapes checked."""
    if raw in (None, ""):
        return []
    if not isinstance(raw, list):
        add_error(
            "after", 'Must be a list of {"kind": ..., "job": id} or {"kind": ..., "array": id}.'
        )
        return []
    if len(raw) > MAX_DEPENDENCIES:
        add_error("after", f"At most {MAX_DEPENDENCIES} dependencies.")
        return []
    parsed: list[tuple[str, After]] = []
    for number, item in enumerate(raw):
        field = f"after[{number}]"
        if not isinstance(item, dict):
            add_error(field, 'Must be an object: {"kind": "after_ok", "job": 12}.')
            continue
        unknown = sorted(str(key)[:30] for key in item if key not in ("kind", "job", "array"))
        if unknown:
            add_error(field, f"Unknown field(s): {', '.join(unknown)}.")
            continue
        kind = item.get("kind")
        if kind not in KINDS:
            add_error(
                f"{field}.kind",
                f"Unknown kind {str(kind)[:30]!r}; choose one of: {', '.join(KINDS)}.",
            )
            continue
        if ("job" in item) == ("array" in item):
            add_error(field, "Name exactly one of job or array.")
            continue
        name = "job" if "job" in item else "array"
        number_id = _positive_id(item[name])
        if number_id is None:
            add_error(f"{field}.{name}", "Must be a positive whole number.")
            continue
        after = After(kind, job_id=number_id) if name == "job" else After(kind, array_id=number_id)
        parsed.append((field, after))
    return parsed


def check_after(
    *, tenant: Tenant, raw: Any, add_error: Callable[[str, str], None]
) -> tuple[After, ...]:
    """A submission's ``after``, checked for ``tenant``; each problem reported by field.

    A list of ``{"kind": "after_ok" | "after_any" | "after_failed", "job": id}``
    or ``{..., "array": id}``.  A job or array of another tenant is answered
    exactly as one that does not exist (nothing leaks); one that has already
    ended so that the dependency can never be met is refused too.
    """
    parsed = _parse(raw, add_error)
    if not parsed:
        return ()
    job_ids = {a.job_id for _f, a in parsed if a.job_id is not None}
    array_ids = {a.array_id for _f, a in parsed if a.array_id is not None}
    states = dict(Job.objects.filter(tenant=tenant, pk__in=job_ids).values_list("pk", "state"))
    arrays = set(
        JobArray.objects.filter(tenant=tenant, pk__in=array_ids).values_list("pk", flat=True)
    )
    ends = task_ends(arrays)
    kept: list[After] = []
    for field, after in parsed:
        if after.job_id is not None:
            if after.job_id not in states:
                add_error(f"{field}.job", f"No job {after.job_id} in tenant {tenant.slug}.")
                continue
            state = states[after.job_id]
            result = outcome(after.kind, state if state in TERMINAL_STATES else None)
            if result is Outcome.NEVER:
                add_error(field, f"Job {after.job_id} is {state}: {after.kind} can never be met.")
                continue
        else:
            assert after.array_id is not None
            if after.array_id not in arrays:
                add_error(f"{field}.array", f"No array {after.array_id} in tenant {tenant.slug}.")
                continue
            if outcome_of_all(after.kind, ends.get(after.array_id, ())) is Outcome.NEVER:
                add_error(
                    field,
                    f"Array {after.array_id} has ended so that {after.kind} can never be met.",
                )
                continue
        kept.append(after)
    return tuple(dict.fromkeys(kept))  # the same dependency twice is one


def check_no_cycle(*, job_id: int, after: Iterable[After]) -> str | None:
    """Why giving job ``job_id`` these dependencies would close a loop (None: it would not).

    Walks the stored dependencies from what ``after`` names; an array stands for its tasks.
    """
    waits_for: dict[str, set[str]] = {str(job_id): set()}
    frontier: set[int] = set()
    for dependency in after:
        for target in _targets(dependency.job_id, dependency.array_id):
            waits_for[str(job_id)].add(str(target))
            frontier.add(target)
    seen: set[int] = set()
    while frontier:
        seen |= frontier
        rows = JobDependency.objects.filter(job_id__in=frontier).values_list(
            "job_id", "on_job_id", "on_array_id"
        )
        frontier = set()
        for waiter, on_job, on_array in rows:
            for target in _targets(on_job, on_array):
                waits_for.setdefault(str(waiter), set()).add(str(target))
                if target not in seen:
                    frontier.add(target)
    loop = find_cycle(waits_for, str(job_id))
    return None if loop is None else "A cycle: " + " → ".join(f"job {j}" for j in loop) + "."


def _targets(job_id: int | None, array_id: int | None) -> list[int]:
    if job_id is not None:
        return [job_id]
    return list(Job.objects.filter(array_id=array_id).values_list("pk", flat=True))


def attach(job: Job, after: Sequence[After]) -> None:
    """Store ``job``'s dependencies (a new job, in its submitting transaction)."""
    JobDependency.objects.bulk_create(
        JobDependency(job=job, kind=a.kind, on_job_id=a.job_id, on_array_id=a.array_id)
        for a in after
    )


def replace_dependencies(job: Job, after: Sequence[After]) -> list[dict[str, Any]]:
    """Replace a locked pending ``job``'s dependencies; the old ones as the API shows them."""
    old = [
        {"kind": d.kind, "job": d.on_job_id}
        if d.on_job_id is not None
        else {"kind": d.kind, "array": d.on_array_id}
        for d in JobDependency.objects.filter(job=job)
    ]
    JobDependency.objects.filter(job=job).delete()
    attach(job, after)
    return old


def current_tasks(rows: Iterable[tuple[int, int | None, int, str]]) -> dict[int, dict[int, str]]:
    """Per array, per TASK_ID, the state of its latest attempt (a retry is a newer job).

    ``rows`` are ``(array, index, job pk, state)``.
    """
    latest: dict[int, dict[int, tuple[int, str]]] = {}
    for array, index, pk, state in rows:
        if index is None:
            continue
        tasks = latest.setdefault(array, {})
        if index not in tasks or tasks[index][0] < pk:
            tasks[index] = (pk, state)
    return {a: {i: s for i, (_pk, s) in tasks.items()} for a, tasks in latest.items()}


def task_ends(array_ids: Iterable[int]) -> dict[int, list[str | None]]:
    """Per array, how each task's latest attempt ended (None: not yet)."""
    ids = list(array_ids)
    if not ids:
        return {}
    rows = Job.objects.filter(array_id__in=ids).values_list(
        "array_id", "array_index", "pk", "state"
    )
    return {
        array: [s if s in TERMINAL_STATES else None for s in tasks.values()]
        for array, tasks in current_tasks(rows).items()
    }


def standing(job: Job) -> tuple[Outcome, str]:
    """Whether ``job``'s dependencies are met, awaited or never to be met, and why in words."""
    return standing_of(list(JobDependency.objects.filter(job=job).select_related("on_job")))


def standing_of(dependencies: Sequence[JobDependency]) -> tuple[Outcome, str]:
    """:func:`standing` of these dependencies (``on_job`` selected with them)."""
    ends = task_ends({d.on_array_id for d in dependencies if d.on_array_id is not None})
    results: list[Outcome] = []
    waiting: list[str] = []
    never = ""
    for dependency in dependencies:
        if dependency.on_job is not None:
            state = dependency.on_job.state
            result = outcome(dependency.kind, state if state in TERMINAL_STATES else None)
            target = f"job {dependency.on_job_id}"
            ended = f"{target} {state}"
        else:
            result = outcome_of_all(dependency.kind, ends.get(dependency.on_array_id or 0, ()))
            target = f"array {dependency.on_array_id}"
            ended = f"a task of {target} did not {_WAITING_FOR[dependency.kind][3:]}"
        results.append(result)
        if result is Outcome.NEVER and not never:
            never = f"{ended}: {dependency.kind} can never be met"
        elif result is Outcome.WAITING:
            waiting.append(f"{target} {_WAITING_FOR[dependency.kind]}")
    overall = combined(results)
    if overall is Outcome.NEVER:
        return overall, never
    if overall is Outcome.WAITING:
        return overall, "waits for " + ", ".join(waiting)
    return overall, ""


def slot_reason(array: JobArray) -> str:
    """Why a task whose dependencies are met still waits: its array's cap."""
    return f"waits for a slot: array {array.pk} runs at most {array.max_running} tasks at once"


def settle(
    job: Job,
    *,
    at: datetime,
    slot_free: bool = True,
    known: tuple[Outcome, str] | None = None,
) -> Outcome:
    """Move a locked pending ``job`` as its dependencies say: queue it when they are met (and
    ``slot_free``: its array's cap allows one more), cancel it with the reason when they
    never will be, else keep it pending with the reason.  Anything but pending: nothing.
    ``known``: its :func:`standing`, when the caller has read it already."""
    if job.state != JobState.PENDING:
        return Outcome.MET
    result, why = known or standing(job)
    if result is Outcome.NEVER:
        job.wait_reason = ""
        job.failure_reason = why[:500]
        transition(job, JobState.CANCELLED, reason=f"cancelled: {why}", at=at)
        broadcast(job, "job.updated")
        return result
    if result is Outcome.MET and not slot_free:
        assert job.array is not None
        why = slot_reason(job.array)
        result = Outcome.WAITING
    if result is Outcome.WAITING:
        if job.wait_reason != why:
            job.wait_reason = why
            save_fields(job, "wait_reason", "updated_at")
        return result
    job.wait_reason = ""
    transition(job, JobState.QUEUED, reason="dependencies met: waiting for GPUs", at=at)
    broadcast(job, "job.updated")
    request_tick()
    return result


def fill_slots(array_id: int, *, at: datetime) -> None:
    """Queue the pending tasks of an array whose dependencies are met, lowest TASK_ID first,
    while it has slots under ``max_running``; cancel those whose dependencies never will be.

    The array row is locked first (two tasks ending at once count the slots one after
    the other), then its pending tasks.
    """
    array = JobArray.objects.select_for_update().get(pk=array_id)
    pending = list(
        Job.objects.select_for_update()
        .filter(array_id=array_id, state=JobState.PENDING)
        .order_by("array_index", "pk")
    )
    if not pending:
        return
    cap = array.max_running
    active = (
        Job.objects.filter(array_id=array_id, state__in=ACTIVE_TASK_STATES).count()
        if cap is not None
        else 0
    )
    # The tasks' dependencies, read once: tasks that wait for the same things (an array's
    # own ``after``) stand the same, so each set is judged once, not once per task.
    found: dict[int, list[JobDependency]] = {}
    for dependency in JobDependency.objects.filter(job__in=[j.pk for j in pending]).select_related(
        "on_job"
    ):
        found.setdefault(dependency.job_id, []).append(dependency)
    judged: dict[frozenset[tuple[str, int | None, int | None]], tuple[Outcome, str]] = {}
    held: list[Job] = []
    for job in pending:
        job.array = array
        full = cap is not None and active >= cap
        mine = found.get(job.pk, [])
        if full and not mine:
            held.append(job)  # nothing to read: it waits for a slot
            continue
        key = frozenset((d.kind, d.on_job_id, d.on_array_id) for d in mine)
        if key not in judged:
            judged[key] = standing_of(mine)
        # A task with dependencies is settled even when the array is full: they may never
        # be met any more, and then it is cancelled rather than left waiting.
        if settle(job, at=at, slot_free=not full, known=judged[key]) is Outcome.MET:
            active += 1
    reason = slot_reason(array)
    held = [job for job in held if job.wait_reason != reason]
    for job in held:
        job.wait_reason = reason
    update_jobs(held, ["wait_reason"])


_ENDED: ContextVar[list[tuple[int, int | None, datetime]] | None] = ContextVar(
    "jobs_ended_to_release", default=None
)
"""The ends still to work off in this thread (None: none being worked off)."""


def on_job_ended(*, job_id: int, array_id: int | None, at: datetime) -> None:
    """Release or cancel what waited for job ``job_id`` (of array ``array_id``), which has just
    ended; fill its array's freed slot.  Runs in the transaction that ended it.

    A job cancelled here is itself an end that others may wait for (a chain, an array's
    every task): such ends are queued and worked off one after the other by the outermost
    call, so a long chain or a large array never recurses.
    """
    queue = _ENDED.get()
    if queue is not None:
        queue.append((job_id, array_id, at))
        return
    queue = [(job_id, array_id, at)]
    token = _ENDED.set(queue)
    try:
        while queue:
            _release_after(*queue.pop(0))
    finally:
        _ENDED.reset(token)


def _release_after(job_id: int, array_id: int | None, at: datetime) -> None:
    """What :func:`on_job_ended` does for one end."""
    where = Q(on_job_id=job_id)
    if array_id is not None:
        where |= Q(on_array_id=array_id)
    waiters = JobDependency.objects.filter(where).values_list("job_id", flat=True)
    rows = Job.objects.filter(pk__in=waiters, state=JobState.PENDING).values_list("pk", "array_id")
    plain = sorted(pk for pk, array in rows if array is None)
    arrays = {array for _pk, array in rows if array is not None}
    if array_id is not None:
        arrays.add(array_id)
    for array in sorted(arrays):
        fill_slots(array, at=at)
    for pk in plain:
        job = Job.objects.select_for_update().filter(pk=pk, state=JobState.PENDING).first()
        if job is not None:
            settle(job, at=at)


@dataclass(frozen=True)
class ForecastWaits:
    """What the forecast needs of the waiting jobs: for each, the live jobs it waits for
    (job ids), and the waiting jobs it leaves out with why."""

    waits_for: Mapping[int, frozenset[int]]
    left_out: Mapping[int, str]


def forecast_waits(pending: Iterable[int]) -> ForecastWaits:
    """For the forecast (``control.forecast``): the live jobs each pending job waits for.

    A dependency on a job that has not ended is a wait for it, one on an array a wait
    for each of its unended tasks (latest attempts).  A capped array's pending task
    waits for the task ``max_running`` places ahead of it (its running and queued
    tasks first, then its pending ones, by TASK_ID): the slot it will take.  The
    forecast assumes every job completes, so a job with an unmet ``after_failed`` is
    left out, and with it whatever waits for it.  Three queries.
    """
    ids = set(pending)
    waits: dict[int, set[int]] = {pk: set() for pk in ids}
    left_out: dict[int, str] = {}
    rows = list(
        JobDependency.objects.filter(job_id__in=ids).values_list(
            "job_id", "kind", "on_job_id", "on_job__state", "on_array_id"
        )
    )
    arrays = {on_array for *_rest, on_array in rows if on_array is not None}
    arrays |= set(
        Job.objects.filter(pk__in=ids, array__max_running__isnull=False).values_list(
            "array_id", flat=True
        )
    )
    tasks = list(
        Job.objects.filter(array_id__in=arrays)
        .exclude(state__in=TERMINAL_STATES)
        .values_list("array_id", "array_index", "pk", "state", "array__max_running")
    )
    unended: dict[int, list[int]] = {}
    for array, _index, pk, _state, _cap in tasks:
        unended.setdefault(array, []).append(pk)
    for job_id, kind, on_job, on_job_state, on_array in rows:
        targets = unended.get(on_array, []) if on_array is not None else [on_job]
        if on_array is None and on_job_state in TERMINAL_STATES:
            targets = []
        if targets and kind == DependencyKind.AFTER_FAILED:
            left_out[job_id] = "starts only if what it waits for fails"
        waits[job_id].update(targets)
    by_array: dict[int, list[tuple[bool, int, int]]] = {}
    caps: dict[int, int] = {}
    for array, index, pk, state, cap in tasks:
        if cap is not None:
            caps[array] = cap
            by_array.setdefault(array, []).append((state == JobState.PENDING, index or 0, pk))
    for array, members in by_array.items():
        order = [pk for _pending, _index, pk in sorted(members)]
        for place, pk in enumerate(order):
            if pk in waits and place >= caps[array]:
                waits[pk].add(order[place - caps[array]])
    changed = True
    while changed:  # what waits for a job left out is left out too
        changed = False
        for pk, awaited in waits.items():
            if pk not in left_out and awaited & left_out.keys():
                left_out[pk] = "waits for a job the forecast leaves out"
                changed = True
    return ForecastWaits(
        waits_for={pk: frozenset(t) for pk, t in waits.items() if t and pk not in left_out},
        left_out=left_out,
    )


def dependencies_of(jobs: Sequence[Job]) -> Mapping[int, list[JobDependency]]:
    """Each job's dependencies, in one query (the API's list)."""
    found: dict[int, list[JobDependency]] = {job.pk: [] for job in jobs}
    for dependency in JobDependency.objects.filter(job__in=[job.pk for job in jobs]):
        found[dependency.job_id].append(dependency)
    return found


__all__ = [
    "ACTIVE_TASK_STATES",
    "MAX_DEPENDENCIES",
    "After",
    "ForecastWaits",
    "attach",
    "check_after",
    "check_no_cycle",
    "current_tasks",
    "dependencies_of",
    "fill_slots",
    "forecast_waits",
    "on_job_ended",
    "replace_dependencies",
    "settle",
    "slot_reason",
    "standing",
    "standing_of",
    "task_ends",
]
