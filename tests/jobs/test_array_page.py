"""The array page: counts per state and each task with its job's link; cancel and retry
from the page; another tenant's array is a 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobs.models import Job
from tests.jobs.test_arrays import submit_array

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def store(tmp_path: Any, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_lists_every_task_and_cancels_them(alice: Any, acme: Any, bob: Any) -> None:
    array = submit_array(alice, acme, size=3, max_running=1)
    client = logged_in(alice)
    page = client.get(f"/arrays/{array.pk}/").content.decode()
    assert f"Array {array.pk}: grid" in page
    for task in Job.objects.filter(array=array):
        assert f'href="/jobs/{task.pk}/"' in page
    assert 'id="array-count-pending">2<' in page and 'id="array-count-queued">1<' in page
    assert "runs at most 1 tasks at once" in page and 'id="array-cancel-form"' in page
    assert logged_in(bob).get(f"/arrays/{array.pk}/").status_code == 404
    assert logged_in(bob).post(f"/arrays/{array.pk}/cancel/").status_code == 404
    response = client.post(f"/arrays/{array.pk}/cancel/")
    assert response.status_code == 302
    assert set(Job.objects.filter(array=array).values_list("state", flat=True)) == {"cancelled"}
    page = client.get(f"/arrays/{array.pk}/").content.decode()
    assert 'id="array-cancel-form"' not in page and 'id="array-count-cancelled">3<' in page
    retry = client.post(f"/arrays/{array.pk}/retry/", follow=True).content.decode()
    assert "no failed task to retry" in retry
