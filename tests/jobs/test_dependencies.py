"""Job dependencies on the real stack: the real tick runs what is released, the agents'
reports end jobs, and every way a job ends (a report, a person's cancel) releases or
cancels what waits for it, in the same transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from control.tick import run_tick
from jobs.arrays import check_array_spec, do_submit_array
from jobs.dependencies import forecast_waits, settle
from jobs.errors import JobValidationError
from jobs.models import Job, JobArray
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from scheduler.dependencies import Outcome
from tests.jobs.control_helpers import demo_cluster, drain_all
from tests.jobs.test_arrays import finish
from tests.jobs.test_programs import bundle_of, program_body

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def store(tmp_path: Any, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


@pytest.fixture
def cluster(acme: Any) -> list[str]:
    nodes = demo_cluster()
    drain_all(nodes)
    acme.profile_jobs = False
    acme.save()
    return nodes


def submit(user: Any, tenant: Any, after: list[dict[str, Any]] | None = None) -> Job:
    bundle = bundle_of(user, tenant)
    data = program_body(bundle.sha256, gpus=1, after=after)
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def state(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def test_after_ok_starts_after_success(alice: Any, acme: Any, cluster: list[str]) -> None:
    first = submit(alice, acme)
    then = submit(alice, acme, after=[{"kind": "after_ok", "job": first.pk}])
    assert (then.state, then.wait_reason) == ("pending", f"waits for job {first.pk} to complete")
    run_tick(policy="fifo")
    assert (state(first), state(then)) == ("running", "pending")  # GPUs are free: it waits
    assert finish(first) == "completed"
    assert state(then) == "queued" and then.wait_reason == ""
    run_tick(policy="fifo")
    assert state(then) == "running"
    reasons = list(then.events.values_list("reason", flat=True))
    assert "dependencies met: waiting for GPUs" in reasons


def test_after_ok_is_cancelled_after_failure_and_the_cancel_cascades(
    alice: Any, acme: Any, cluster: list[str]
) -> None:
    first = submit(alice, acme)
    then = submit(alice, acme, after=[{"kind": "after_ok", "job": first.pk}])
    after_then = submit(alice, acme, after=[{"kind": "after_ok", "job": then.pk}])
    on_failure = submit(alice, acme, after=[{"kind": "after_failed", "job": first.pk}])
    anyway = submit(alice, acme, after=[{"kind": "after_any", "job": first.pk}])
    run_tick(policy="fifo")
    assert finish(first, "crashed") == "failed"
    assert state(then) == "cancelled"
    assert then.failure_reason == f"job {first.pk} failed: after_ok can never be met"
    assert state(after_then) == "cancelled"
    assert after_then.failure_reason == f"job {then.pk} cancelled: after_ok can never be met"
    assert (state(on_failure), state(anyway)) == ("queued", "queued")


def test_a_cancel_by_a_person_releases_after_any_and_cancels_after_ok(
    alice: Any, acme: Any, cluster: list[str]
) -> None:
    first = submit(alice, acme)
    ok = submit(alice, acme, after=[{"kind": "after_ok", "job": first.pk}])
    anyway = submit(alice, acme, after=[{"kind": "after_any", "job": first.pk}])
    failed = submit(alice, acme, after=[{"kind": "after_failed", "job": first.pk}])
    do_cancel_job(user=alice, job_id=first.pk)
    assert (state(ok), state(anyway), state(failed)) == ("cancelled", "queued", "cancelled")


def test_a_dependency_on_an_array_is_met_when_every_task_is(
    alice: Any, acme: Any, cluster: list[str]
) -> None:
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, name="grid", gpus=1, size=2)
    array = do_submit_array(user=alice, tenant=acme, spec=check_array_spec(tenant=acme, data=data))
    then = submit(alice, acme, after=[{"kind": "after_ok", "array": array.pk}])
    assert then.wait_reason == f"waits for array {array.pk} to complete"
    run_tick(policy="fifo")
    first, second = Job.objects.filter(array=array).order_by("array_index")
    assert finish(first) == "completed"
    assert state(then) == "pending"
    assert finish(second) == "completed"
    assert state(then) == "queued"


def test_an_array_waits_for_its_dependency_then_fills_its_cap(
    alice: Any, acme: Any, cluster: list[str]
) -> None:
    first = submit(alice, acme)
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, name="grid", gpus=1, size=3, max_running=2,
                        after=[{"kind": "after_ok", "job": first.pk}])  # fmt: skip
    array = do_submit_array(user=alice, tenant=acme, spec=check_array_spec(tenant=acme, data=data))
    tasks = Job.objects.filter(array=array).order_by("array_index")
    assert [t.state for t in tasks] == ["pending"] * 3
    run_tick(policy="fifo")
    assert finish(first) == "completed"
    assert [t.state for t in tasks.all()] == ["queued", "queued", "pending"]


def test_settling_twice_changes_nothing(alice: Any, acme: Any, cluster: list[str]) -> None:
    """The release is idempotent: a second end, or the same one heard twice, is no change."""
    first = submit(alice, acme)
    then = submit(alice, acme, after=[{"kind": "after_any", "job": first.pk}])
    do_cancel_job(user=alice, job_id=first.pk)
    assert state(then) == "queued"
    events = then.events.count()
    assert settle(then, at=timezone.now()) is Outcome.MET
    assert state(then) == "queued" and then.events.count() == events


@pytest.mark.parametrize(
    ("after", "field"),
    [
        ([{"kind": "after_maybe", "job": 1}], "after[0].kind"),
        ([{"kind": "after_ok"}], "after[0]"),
        ([{"kind": "after_ok", "job": 1, "array": 1}], "after[0]"),
        ([{"kind": "after_ok", "job": "1"}], "after[0].job"),
        ([{"kind": "after_ok", "job": 999999}], "after[0].job"),
        ([{"kind": "after_ok", "array": 999999}], "after[0].array"),
        ("ok:1", "after"),
        ([{"kind": "after_ok", "job": 1, "extra": 1}], "after[0]"),
    ],
)
def test_a_bad_dependency_is_refused_naming_its_field(
    alice: Any, acme: Any, after: Any, field: str
) -> None:
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, gpus=1, after=after)
    with pytest.raises(JobValidationError) as refused:
        check_job_spec(tenant=acme, data=data)
    assert field in refused.value.errors


def test_another_tenants_job_is_refused_exactly_as_a_missing_one(
    alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    theirs = submit(bob, globex)
    theirs_array = do_submit_array(
        user=bob,
        tenant=globex,
        spec=check_array_spec(
            tenant=globex,
            data=program_body(bundle_of(bob, globex).sha256, gpus=1, size=1),
        ),
    )
    bundle = bundle_of(alice, acme)
    messages = []
    for target in ({"job": theirs.pk}, {"job": 10**9}, {"array": theirs_array.pk},
                   {"array": 10**9}):  # fmt: skip
        name = next(iter(target))
        data = program_body(bundle.sha256, gpus=1, after=[{"kind": "after_ok", **target}])
        with pytest.raises(JobValidationError) as refused:
            check_job_spec(tenant=acme, data=data)
        (message,) = refused.value.errors[f"after[0].{name}"]
        messages.append(message.replace(str(target[name]), "N"))
    assert messages[0] == messages[1] == "No job N in tenant acme."
    assert messages[2] == messages[3] == "No array N in tenant acme."
    assert not Job.objects.filter(tenant=acme).exists()
    assert JobArray.objects.filter(tenant=acme).count() == 0


def test_a_dependency_that_can_never_be_met_is_refused(alice: Any, acme: Any) -> None:
    first = submit(alice, acme)
    do_cancel_job(user=alice, job_id=first.pk)
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, gpus=1, after=[{"kind": "after_ok", "job": first.pk}])
    with pytest.raises(JobValidationError) as refused:
        check_job_spec(tenant=acme, data=data)
    assert refused.value.errors["after[0]"] == [
        f"Job {first.pk} is cancelled: after_ok can never be met."
    ]
    data["after"] = [{"kind": "after_any", "job": first.pk}]
    job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=data))
    assert job.state == "queued"  # already met: straight to the queue


def test_the_forecast_is_told_what_each_waiting_job_waits_for(alice: Any, acme: Any) -> None:
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, name="grid", gpus=1, size=4, max_running=2)
    array = do_submit_array(user=alice, tenant=acme, spec=check_array_spec(tenant=acme, data=data))
    t0, t1, t2, t3 = Job.objects.filter(array=array).order_by("array_index")
    after_array = submit(alice, acme, after=[{"kind": "after_ok", "array": array.pk}])
    first = submit(alice, acme)
    on_failure = submit(alice, acme, after=[{"kind": "after_failed", "job": first.pk}])
    behind = submit(alice, acme, after=[{"kind": "after_any", "job": on_failure.pk}])
    pending = Job.objects.filter(state="pending").values_list("pk", flat=True)
    found = forecast_waits(pending)
    assert found.waits_for == {
        t2.pk: frozenset({t0.pk}),  # the slot t0 frees
        t3.pk: frozenset({t1.pk}),
        after_array.pk: frozenset({t0.pk, t1.pk, t2.pk, t3.pk}),
    }
    assert set(found.left_out) == {on_failure.pk, behind.pk}


def test_an_end_by_the_tick_releases_and_cancels_too(
    alice: Any, acme: Any, cluster: list[str]
) -> None:
    """The tick stops a job at its run-time limit (a failure): what waited for it follows in
    the tick's own transaction (released before its pass: that tick may already start it)."""
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, gpus=1, max_runtime_s=60, max_restarts=0)
    limited = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=data))
    on_failure = submit(alice, acme, after=[{"kind": "after_failed", "job": limited.pk}])
    on_success = submit(alice, acme, after=[{"kind": "after_ok", "job": limited.pk}])
    run_tick(policy="fifo")
    assert state(limited) == "running"
    Job.objects.filter(pk=limited.pk).update(started_at=timezone.now() - timedelta(seconds=61))
    run_tick(policy="fifo")
    assert (state(limited), limited.failure_reason) == ("failed", "run-time limit reached")
    assert state(on_success) == "cancelled"
    assert state(on_failure) in ("queued", "running")
    run_tick(policy="fifo")
    assert state(on_failure) == "running"


def test_a_failure_cancels_a_large_array_and_a_long_chain_without_recursing(
    alice: Any, acme: Any
) -> None:
    """Each cancellation is itself an end that others may wait for: they are worked off one
    after the other in the same transaction, not by recursion (150 tasks, a 150-job chain)."""
    acme.max_queued_jobs = 400
    acme.save()
    first = submit(alice, acme)
    bundle = bundle_of(alice, acme)
    data = program_body(bundle.sha256, name="grid", gpus=1, size=150,
                        after=[{"kind": "after_ok", "job": first.pk}])  # fmt: skip
    array = do_submit_array(user=alice, tenant=acme, spec=check_array_spec(tenant=acme, data=data))
    chain = [first]
    for _ in range(150):
        after = [{"kind": "after_ok", "job": chain[-1].pk}]
        data = {"name": "link", "workload": "mlp-digits", "gpus": 1, "after": after}
        spec = check_job_spec(tenant=acme, data=data)
        chain.append(do_submit_job(user=alice, tenant=acme, spec=spec))
    do_cancel_job(user=alice, job_id=first.pk)
    assert set(Job.objects.filter(array=array).values_list("state", flat=True)) == {"cancelled"}
    assert state(chain[-1]) == "cancelled"
