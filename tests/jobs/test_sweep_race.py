"""Two trials' jobs end at once, in two transactions (PostgreSQL): the sweep sees both
results, one after the other, because each end locks the sweep's row before it reads the
trials — so the better of the two is promoted exactly once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from control.tick import run_tick
from jobs.choices import JobState
from jobs.models import Job, Trial
from tests.jobs.outputs_helpers import metrics
from tests.jobs.test_sweeps import submit_sweep, trials
from tests.jobs.workflow_helpers import end_in_own_transaction, quiet_demo_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL")
def test_two_trials_ending_at_once_promote_the_better_once(alice: Any, acme: Any) -> None:
    quiet_demo_cluster(acme)
    sweep = submit_sweep(alice, acme, max_trials=2, search_space={
        "lr": {"type": "grid", "values": [0.8, 0.1]}})  # fmt: skip
    run_tick(policy="fifo")
    worse, better = (t.job for t in trials(sweep))
    assert worse is not None and better is not None
    for job, loss in ((worse, 0.9), (better, 0.1)):
        job.refresh_from_db()
        assert job.state == "running"
        assert metrics(job, [(10, {"loss": loss})]) == "metrics"
    release, first_held = threading.Event(), threading.Event()
    first_done, second_done = threading.Event(), threading.Event()
    one = threading.Thread(
        target=end_in_own_transaction,
        args=(worse.pk, JobState.COMPLETED, first_done, release, first_held),
    )
    one.start()
    assert first_held.wait(10)  # trial 0 recorded, waiting alone; the sweep row is held
    two = threading.Thread(
        target=end_in_own_transaction, args=(better.pk, JobState.COMPLETED, second_done)
    )
    two.start()
    two.join(0.5)
    assert not second_done.is_set()  # blocked on the sweep's row
    release.set()
    one.join(10)
    two.join(10)
    assert first_done.is_set() and second_done.is_set()
    assert [(t.index, t.status, t.rung) for t in trials(sweep)] == [
        (0, "stopped", 0),
        (1, "running", 1),
    ]
    promoted = Trial.objects.get(sweep=sweep, index=1).job
    assert promoted is not None and promoted.pk != better.pk
    assert Job.objects.filter(trial__sweep=sweep).count() == 3  # one promotion, not two
    # the program left no checkpoint: the new job trains from step 0, and says so
    assert promoted.resumed_from_id is None
    assert promoted.events.filter(reason=f"job {better.pk} left no checkpoint: from step 0")
