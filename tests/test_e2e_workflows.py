"""End to end: an array's cap and a job's dependencies on the real stack (issue 40).

The node agents run a real, tiny ``torchrun`` program: it prints its
``TASK_ID`` and ``TASK_COUNT``, does a few seconds of single-threaded work, and
exits with the code it is given.  A 6-task array capped at 2 never has more than
2 tasks queued or running — sampled through the API while it runs, and proved
afterwards from every task's history — and every task sees its own id;
``after_ok`` starts after its dependency completed and is cancelled, naming it,
when the dependency failed; ``after_any`` on the failed job starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.test_e2e import api, events, idle_cluster, job_state, log_text, upload_code, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.slow]
__all__ = ["idle_cluster"]  # the shared stack's autouse fixture: earlier jobs ended first

PROGRAM = '''
"""Print the task, work a few seconds on one thread, exit with the code asked for."""
import os
import sys
import time

import torch

torch.set_num_threads(1)
print(f"task {os.environ.get('TASK_ID', '-')} of {os.environ.get('TASK_COUNT', '-')}", flush=True)
x = torch.eye(32)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    x = torch.tanh(x @ x + 1.0)
    time.sleep(0.05)  # the machine's two cores are shared: work, but lightly
print("work done", flush=True)
sys.exit(int(sys.argv[2]))
'''

ACTIVE = ("queued", "running", "scaling")
ENDED = ("completed", "failed", "cancelled")


def program(stack: dict[str, Any], tmp_path: Path) -> str:
    """The uploaded program's code id."""
    (tmp_path / "work.py").write_text(PROGRAM)
    return upload_code(stack, tmp_path)


def body(code: str, name: str, seconds: float, exit_code: int = 0, **extra: Any) -> dict[str, Any]:
    """A one-GPU submission of the program that works ``seconds`` and exits ``exit_code``."""
    return {"name": name, "code": code, "entrypoint": f"work.py {seconds} {exit_code}",
            "launcher": "torchrun", "gpus": 1, "min_gpus": 1, "max_gpus": 1, **extra}  # fmt: skip


def when(history: Iterable[dict[str, Any]], states: Iterable[str]) -> datetime | None:
    """The time of the first event of ``history`` into one of ``states``, if any."""
    wanted = set(states)
    found = [datetime.fromisoformat(e["at"]) for e in history if e["to_state"] in wanted]
    return min(found) if found else None


def most_at_once(spans: Iterable[tuple[datetime, datetime]]) -> int:
    """The most half-open spans ``[start, end)`` that hold at one instant (an end and a start
    at the same instant do not overlap: a task's end releases the next in its transaction)."""
    edges = sorted((at, step) for start, end in spans for at, step in ((start, 1), (end, -1)))
    most = current = 0
    for _at, step in edges:  # at equal instants -1 sorts before +1
        current += step
        most = max(most, current)
    return most


def test_an_array_capped_at_two_never_runs_more_and_each_task_sees_its_id(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    code = program(stack, tmp_path)
    array = api(stack, "/api/v1/arrays/", {**body(code, "capped", 3.0), "size": 6,
                                           "max_running": 2})  # fmt: skip
    assert array["size"] == 6 and len(array["tasks"]) == 6, array
    samples: list[dict[str, int]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        counts = dict(api(stack, f"/api/v1/arrays/{array['id']}/")["counts"])
        samples.append(counts)
        if sum(counts.get(state, 0) for state in ENDED) == 6:
            break
        time.sleep(0.2)
    assert samples[-1].get("completed") == 6, samples[-1]
    busiest = max(sum(s.get(state, 0) for state in ACTIVE) for s in samples)
    assert busiest == 2, samples  # the cap was reached, never passed
    assert len(samples) > 20, len(samples)  # sampled the whole run, finely

    detail = api(stack, f"/api/v1/arrays/{array['id']}/")
    spans = []
    for task in detail["tasks"]:
        history = events(stack, task["job"])
        start, end = when(history, ["queued"]), when(history, ENDED)
        assert start is not None and end is not None and start <= end, history
        spans.append((start, end))
        text = log_text(stack, task["job"])
        assert f"task {task['task_id']} of 6" in text and "work done" in text, text
    assert sorted(t["task_id"] for t in detail["tasks"]) == list(range(6))
    assert most_at_once(spans) == 2, spans


def test_after_ok_starts_after_success_and_is_cancelled_after_failure_after_any_runs(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    code = program(stack, tmp_path)
    first = api(stack, "/api/v1/jobs/", body(code, "first", 3.0))
    failing = api(stack, "/api/v1/jobs/", body(code, "failing", 1.0, exit_code=3))
    then = api(stack, "/api/v1/jobs/",
               body(code, "then", 1.0, after=[{"kind": "after_ok", "job": first["id"]}]))  # fmt: skip
    doomed = api(stack, "/api/v1/jobs/",
                 body(code, "doomed", 1.0, after=[{"kind": "after_ok", "job": failing["id"]}]))  # fmt: skip
    anyway = api(stack, "/api/v1/jobs/",
                 body(code, "anyway", 1.0, after=[{"kind": "after_any", "job": failing["id"]}]))  # fmt: skip
    assert then["state"] == "pending", then
    assert then["wait_reason"] == f"waits for job {first['id']} to complete", then
    jobs = (first, failing, then, doomed, anyway)
    wait_for("every job to end",
             lambda: all(job_state(stack, j["id"])["state"] in ENDED for j in jobs),
             stack, 300)  # fmt: skip
    final = {j["name"]: job_state(stack, j["id"]) for j in jobs}
    story = {name: (j["state"], j["failure_reason"]) for name, j in final.items()}
    assert final["first"]["state"] == "completed" and final["failing"]["state"] == "failed", story
    assert final["then"]["state"] == "completed", story
    started = when(events(stack, then["id"]), ["running"])
    completed = when(events(stack, first["id"]), ["completed"])
    assert started is not None and completed is not None and started > completed, story
    assert final["doomed"]["state"] == "cancelled", story
    assert final["doomed"]["failure_reason"] == (
        f"job {failing['id']} failed: after_ok can never be met"
    ), story
    assert when(events(stack, doomed["id"]), ["running"]) is None  # never started
    assert final["anyway"]["state"] == "completed", story
    assert "work done" in log_text(stack, anyway["id"])
