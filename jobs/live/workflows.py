"""What a job's page shows of its workflow: the array it is a task of, what it waits for.

::

    job page ── Workflow card ── "Task 3 of array 7: grid (6 tasks)"        (job.array)
                              ├─ "Waits for: job 12 to complete, ..."        (job.wait_reason)
                              └─ dependencies: after_ok → job 12 (running)   (dependency_rows)

Read with a fixed number of queries (one for the dependencies and their
targets, one for the arrays' task states), whatever the number of dependencies.
"""

from __future__ import annotations

from typing import Any

from jobs.choices import DependencyKind
from jobs.dependencies import task_ends
from jobs.models import Job

KIND_WORDS: dict[str, str] = {
    DependencyKind.AFTER_OK: "after it completes",
    DependencyKind.AFTER_ANY: "after it ends, however",
    DependencyKind.AFTER_FAILED: "only if it fails",
}
"""Each dependency kind in the words of a job's page."""


def dependency_rows(job: Job) -> list[dict[str, Any]]:
    """Each dependency of ``job``: its kind, what it names (with a link) and how that stands.

    A job's state is its own; an array's is how many of its tasks have ended.
    Both belong to the job's tenant (``check_after`` refused any other).
    """
    dependencies = list(job.dependencies.select_related("on_job", "on_array"))
    ends = task_ends({d.on_array_id for d in dependencies if d.on_array_id is not None})
    rows = []
    for dependency in dependencies:
        row = {"kind": dependency.kind, "words": KIND_WORDS.get(dependency.kind, dependency.kind)}
        if dependency.on_job is not None:
            target = dependency.on_job
            row.update(target=f"job {target.pk}", name=target.name, url=f"/jobs/{target.pk}/")
            row["standing"] = target.state
        elif dependency.on_array is not None:
            array = dependency.on_array
            row.update(target=f"array {array.pk}", name=array.name, url=f"/arrays/{array.pk}/")
            tasks = ends.get(array.pk, [])
            ended = sum(1 for end in tasks if end is not None)
            row["standing"] = f"{ended} of {array.size} tasks ended"
        rows.append(row)
    return rows
