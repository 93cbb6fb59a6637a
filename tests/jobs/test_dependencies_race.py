"""Two dependencies of one job end at once, in two transactions (PostgreSQL): the job is
released exactly once, by whichever transaction locks it second — it reads the other's
end only because it locks the waiting job before it reads the dependencies."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.workflow_helpers import end_in_own_transaction

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Any, after: list[dict[str, Any]] | None = None) -> Job:
    data = {"name": "j", "workload": "mlp-digits", "gpus": 1, "after": after}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL")
def test_two_ends_at_once_release_the_waiting_job_once(alice: Any, acme: Any) -> None:
    first, second = submit(alice, acme), submit(alice, acme)
    waiting = submit(alice, acme, after=[{"kind": "after_any", "job": first.pk},
                                         {"kind": "after_any", "job": second.pk}])  # fmt: skip
    assert waiting.state == "pending"
    release_first, first_held = threading.Event(), threading.Event()
    first_done, second_done = threading.Event(), threading.Event()
    one = threading.Thread(
        target=end_in_own_transaction,
        args=(first.pk, JobState.CANCELLED, first_done, release_first, first_held),
    )
    one.start()
    # The first transaction ends its job and settles the waiting one (which still waits
    # for the second), and holds the waiting job's row lock until told to commit.
    assert first_held.wait(10)
    two = threading.Thread(
        target=end_in_own_transaction, args=(second.pk, JobState.CANCELLED, second_done)
    )
    two.start()
    two.join(0.5)
    assert not second_done.is_set()  # blocked on the waiting job's row, held by the first
    release_first.set()
    one.join(10)
    two.join(10)
    assert first_done.is_set() and second_done.is_set()
    waiting.refresh_from_db()
    assert waiting.state == "queued"
    moves = list(waiting.events.filter(to_state="queued").values_list("reason", flat=True))
    assert moves == ["dependencies met: waiting for GPUs"]
