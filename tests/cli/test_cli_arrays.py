"""``portalctl array`` and ``submit --after`` against the real portal: the command line's
requests go through httpx into the Django application in this process (the real URLs,
token authentication, serializers and services), so what they create is in the database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.models import Job, JobArray
from portalctl.after import parse_after
from tests.cli.in_process import env, run, store
from tests.jobs.test_programs import bundle_of

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["env", "store"]  # tests.cli.in_process's fixtures, used here by name


@pytest.mark.parametrize(
    ("text", "after"),
    [
        ("ok:12", [{"kind": "after_ok", "job": 12}]),
        ("ok:12,any:13", [{"kind": "after_ok", "job": 12}, {"kind": "after_any", "job": 13}]),
        ("failed:4, after_ok:array:5", [{"kind": "after_failed", "job": 4},
                                        {"kind": "after_ok", "array": 5}]),
    ],
)  # fmt: skip
def test_parse_after(text: str, after: list[dict[str, Any]]) -> None:
    assert parse_after(text) == after


@pytest.mark.parametrize("text", ["", "ok", "soon:1", "ok:x", "ok:0", "ok:job:1", "ok:array:"])
def test_parse_after_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError):
        parse_after(text)


def test_array_submit_get_cancel(env: dict[str, str], alice: Any, acme: Any) -> None:
    code = bundle_of(alice, acme).sha256
    submitted = run(env, "array", "submit", "--code", code, "--entrypoint", "train.py",
                    "--launcher", "torchrun", "--size", "6", "--max-running", "2", "--name",
                    "grid", "--env", "LR=0.1")  # fmt: skip
    assert submitted.exit_code == 0, submitted.output
    array = JobArray.objects.get(pk=int(submitted.output))
    assert (array.size, array.max_running) == (6, 2)
    shown = run(env, "array", "get", str(array.pk))
    assert shown.exit_code == 0, shown.output
    assert "6 tasks, at most 2 at once: 4 pending, 2 queued" in shown.output
    as_json = json.loads(run(env, "array", "get", str(array.pk), "-o", "json").output)
    assert [t["task_id"] for t in as_json["tasks"]] == list(range(6))
    listed = run(env, "array", "ls")
    assert listed.exit_code == 0 and "grid" in listed.output
    cancelled = run(env, "array", "cancel", str(array.pk))
    assert cancelled.exit_code == 0 and "6 cancelled" in cancelled.output
    again = run(env, "array", "cancel", str(array.pk))
    assert again.exit_code == 4 and "no task left" in again.output  # the server's 409


def test_submit_after_waits_and_a_bad_after_is_refused(
    env: dict[str, str], alice: Any, acme: Any
) -> None:
    code = bundle_of(alice, acme).sha256
    base = ["submit", "--code", code, "--entrypoint", "train.py", "--launcher", "torchrun"]
    first = run(env, *base)
    assert first.exit_code == 0, first.output
    first_id = int(first.output)
    then = run(env, *base, "--after", f"ok:{first_id}", "-o", "json")
    assert then.exit_code == 0, then.output
    shown = json.loads(then.output)
    assert shown["state"] == "pending" and shown["after"] == [{"kind": "after_ok", "job": first_id}]
    missing = run(env, *base, "--after", "ok:999999")
    assert missing.exit_code == 4 and "No job 999999 in tenant acme" in missing.output
    unreadable = run(env, *base, "--after", "sometime:3")
    assert unreadable.exit_code == 2
    assert Job.objects.count() == 2
