"""End to end: a worker slowed from outside is reported, removed, and its GPU kept out of use.

The real stack (``manage.py runstack``, four node agents, PostgreSQL and Redis
when ``DATABASE_URL``/``REDIS_URL`` are set) trains an elastic built-in job on
the 8-slot demo fabric; one of its workers is slowed by SIGSTOP/SIGCONT on a
duty cycle (``bench/straggler_loop.py``, the same loop as the benchmark).  The
assertions are on what happened, not on how fast: the benchmark measures that.
"""

from __future__ import annotations

import pytest

from bench.straggler_loop import job_pids, running_stack, straggler_loop, wait_until

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(900)]

REDIS_DB = 15  # the shared e2e stack uses 11, e2e storage 12, the fault suite 13, sim_vs_real 10


def test_a_slowed_worker_is_removed_or_moved_and_its_gpu_stays_out_of_new_placements() -> None:
    with running_stack(redis_db=REDIS_DB) as stack:
        result = straggler_loop(stack, watch_s=10.0)
        slow = int(result["slowed_worker"][1:])
        # Above its minimum: the control plane removed that worker and freed its GPU.
        assert result["event_action"] == "removed", result
        assert f"worker w{slow} on GPU {slow}" in result["event_reason"]
        assert result["ratio"] > 1.2
        assert slow not in result["job_gpus_after"]
        # Its GPU is suspect, and neither the job nor the next one got it back.
        assert result["suspect"] is True
        assert result["next_job_gpus"] and slow not in result["next_job_gpus"]
        assert result["suspect_gpu_handed_out"] is False
        # Shown in the job's history, and the job trains on.
        history = stack.api.events(result["job"])
        assert any(e["kind"] == "straggler" and e["data"]["gpu"] == slow for e in history)
        assert any(e["reason"].startswith("switch done") for e in history)
        assert stack.api.call(f"/api/v1/jobs/{result['job']}/")["state"] in ("running", "scaling")
        for job in stack.jobs:
            stack.api.call(f"/api/v1/jobs/{job}/cancel/", {})
        # Only the mark this scenario made stays. Under the 2-core machine's contention the
        # runtime has flagged a second worker of the first job during the watch (1.36x the
        # median, seen in CI 2026-12-03); that mark would leave the next job's leaf without
        # a free GPU to move to, and the move is what follows.
        stack.db.write('UPDATE portal_gpu SET suspect_until = NULL WHERE "index" <> %s', [slow])
        # And their processes are gone: on a loaded machine a cancelled worker still ending
        # holds its slot, the move's joiner placed there is refused ("slot busy") and the
        # switch watchdog undoes the move (seen in CI 2026-12-05: no switch in 300 s).
        gone = [wait_until(f"job {job}'s processes to end", lambda j=job: not job_pids(j), 120)
                for job in stack.jobs]  # fmt: skip
        assert all(gone)

        # At its minimum: the worker moves to a free GPU (one switch), the job keeps its size.
        moved = straggler_loop(stack, gpus=2, min_gpus=2, follow=False)
        other = int(moved["slowed_worker"][1:])
        assert moved["event_action"] == "moved", moved
        target = moved["moved_to"]
        assert target not in (slow, other) and target in moved["job_gpus_moved"]
        assert other not in moved["job_gpus_moved"] and len(moved["job_gpus_moved"]) == 2
        assert moved["suspect"] is True
        detail = stack.api.call(f"/api/v1/jobs/{moved['job']}/")
        assert detail["state"] == "running" and detail["parallelism"] == 2
