"""A straggler report is the tenant program's word: it may cost other tenants one GPU at most.

The runtime that flags stragglers runs inside the program, and the agent has
no timing of its own to check it against.  Forged reports marked healthy GPUs
suspect one after another (each move put the job on a fresh GPU to accuse).
The job still acts on its own workers; its reports hold one GPU suspect at a time.
"""

from __future__ import annotations

from typing import Any

import pytest

from control.reports import handle_report
from tests.jobs.test_recovered_holdings import held, running
from tests.jobs.test_stragglers import scale_done, sent, straggler, suspect_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_jobs_straggler_reports_hold_one_gpu_suspect_at_a_time(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=2)
    keep, slow = held(job)
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler moved"
    assert suspect_until(slow) is not None
    [_, moved_to] = held(job)
    handle_report(scale_done(job, "1700000000020-0", [keep, moved_to]))
    sent("migrate")
    # Now it accuses the GPU it was just given, and the one it kept.
    handle_report(straggler(job, "1700000000030-0", f"w{moved_to}"))
    assert suspect_until(moved_to) is None, "a second GPU marked suspect on the job's word"
    assert suspect_until(keep) is None
    event = job.events.filter(kind="straggler").latest("id")
    assert event.data["worker"] == f"w{moved_to}"  # still recorded, and acted on for the job
