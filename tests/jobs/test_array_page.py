"""The array page: counts per state and each task with its job's link; cancel and retry
from the page; another tenant's array is a 404."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.test_arrays import submit_array
from tests.jobs.test_programs import bundle_of, program_body
from tests.jobs.workflow_helpers import logged_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


def test_the_page_lists_every_task_and_cancels_them(alice: Any, acme: Any, bob: Any) -> None:
    array = submit_array(alice, acme, size=3, max_running=1)
    client = logged_in(alice)
    page = client.get(f"/arrays/{array.pk}/").content.decode()
    assert f"Array {array.pk}: grid" in page
    for task in Job.objects.filter(array=array):
        assert f'href="/jobs/{task.pk}/"' in page
    assert 'id="array-count-pending">2<' in page and 'id="array-count-queued">1<' in page
    assert "runs at most 1 tasks at once" in page and 'id="array-cancel-form">' in page
    assert 'id="array-retry-form" hidden' in page  # shown live once a task fails
    assert f'data-tenant="{acme.pk}"' in page and "js/array.js" in page
    assert logged_in(bob).get(f"/arrays/{array.pk}/").status_code == 404
    assert logged_in(bob).post(f"/arrays/{array.pk}/cancel/").status_code == 404
    response = client.post(f"/arrays/{array.pk}/cancel/")
    assert response.status_code == 302
    assert set(Job.objects.filter(array=array).values_list("state", flat=True)) == {"cancelled"}
    page = client.get(f"/arrays/{array.pk}/").content.decode()
    assert f"Array {array.pk} cancelled." in page
    assert 'id="array-cancel-form" hidden' in page and 'id="array-count-cancelled">3<' in page
    assert 'id="array-retry-form" hidden' in page
    retry = client.post(f"/arrays/{array.pk}/retry/", follow=True).content.decode()
    assert "no failed task to retry" in retry


def submit_after(user: Any, tenant: Any, after: list[dict[str, Any]]) -> Job:
    bundle = bundle_of(user, tenant)
    data = program_body(bundle.sha256, name="evaluate", gpus=1, after=after)
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def test_a_task_page_links_to_its_array(alice: Any, acme: Any) -> None:
    array = submit_array(alice, acme, size=3, max_running=1)
    second = Job.objects.get(array=array, array_index=1)
    page = logged_in(alice).get(f"/jobs/{second.pk}/").content.decode()
    assert f'<a href="/arrays/{array.pk}/">array {array.pk}: grid</a>' in page
    assert "Task <strong>1</strong> of" in page and "3 tasks, at most 1 at once" in page
    # A pending task says what it waits for: a slot of its array.
    assert f"array {array.pk} runs at most 1 tasks at once" in page
    assert 'id="job-wait" hidden' not in page


def test_a_waiting_job_shows_its_dependencies_with_links(alice: Any, acme: Any) -> None:
    array = submit_array(alice, acme, size=2)
    first = Job.objects.get(array=array, array_index=0)
    then = submit_after(
        alice,
        acme,
        [{"kind": "after_ok", "job": first.pk}, {"kind": "after_any", "array": array.pk}],
    )
    assert then.state == "pending"
    page = logged_in(alice).get(f"/jobs/{then.pk}/").content.decode()
    assert f'<a href="/jobs/{first.pk}/">job {first.pk}</a>' in page
    assert f'<a href="/arrays/{array.pk}/">array {array.pk}</a>' in page
    assert "after it completes" in page and "after it ends, however" in page
    assert "0 of 2 tasks ended" in page
    assert f'id="job-wait-reason">waits for job {first.pk} to complete' in page
    assert 'id="job-array"' not in page  # not a task itself


def test_a_plain_job_has_no_workflow_card(alice: Any, acme: Any) -> None:
    job = submit_after(alice, acme, [])
    page = logged_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-workflow" hidden' in page and 'id="job-dependencies"' not in page
