"""The sweep page: every trial with its job, the charts' data, the best trial with a link to
its checkpoint, cancel from the page; another tenant's sweep is a 404."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from control.tick import run_tick
from tests.jobs.test_sweeps import submit_sweep, train, trials
from tests.jobs.workflow_helpers import logged_in, quiet_demo_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


def snapshot(page: str) -> dict[str, Any]:
    found = re.search(r'<script id="sweep-snapshot" type="application/json">(.*?)</script>', page)
    assert found is not None
    return dict(json.loads(found.group(1)))


def test_the_page_shows_trials_curves_and_the_best_checkpoint(
    alice: Any, acme: Any, bob: Any
) -> None:
    quiet_demo_cluster(acme)
    sweep = submit_sweep(alice, acme)
    run_tick(policy="fifo")
    for index in (1, 3):
        job = trials(sweep)[index].job
        assert job is not None
        job.refresh_from_db()
        assert train(job, 10) == "completed"
    client = logged_in(alice)
    page = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert f"Sweep {sweep.pk}: lr-search" in page
    for trial in trials(sweep):
        assert f'href="/jobs/{trial.job_id}/"' in page
    data = snapshot(page)
    assert data["rungs"] == [10, 20, 40] and data["metric"] == "loss"
    assert set(data["curves"]) == {"1", "3"}
    assert data["curves"]["1"] == [[10, pytest.approx(0.15)]]
    best = trials(sweep)[1]
    assert best.job is not None
    # trial 1 was promoted: its current job holds the checkpoint its rung-0 job left
    checkpoint = best.job.artifacts.get(kind="checkpoint")
    assert "Trial <strong>1</strong>" in page and 'id="best-checkpoint"' in page
    assert f"/api/v1/jobs/{best.job_id}/artifacts/{checkpoint.pk}/download/" in page
    assert checkpoint.step == 10
    download = client.get(f"/api/v1/jobs/{best.job_id}/artifacts/{checkpoint.pk}/download/")
    assert download.status_code == 200
    assert b"".join(download.streaming_content)[:2] == b"PK"  # a torch.save zip
    assert "vendor/plotly/plotly.min.js" in page and "js/sweep.js" in page
    assert "cdn" not in page.lower()
    listed = client.get("/sweeps/").content.decode()
    assert f'href="/sweeps/{sweep.pk}/">{sweep.pk}: lr-search</a>' in listed
    assert f"/sweeps/{sweep.pk}/" not in logged_in(bob).get("/sweeps/").content.decode()
    assert logged_in(bob).get(f"/sweeps/{sweep.pk}/").status_code == 404
    assert logged_in(bob).post(f"/sweeps/{sweep.pk}/cancel/").status_code == 404
    cancelled = client.post(f"/sweeps/{sweep.pk}/cancel/")
    assert cancelled.status_code == 302
    assert f"Sweep {sweep.pk} cancelled." in client.get(cancelled.url).content.decode()
    sweep.refresh_from_db()
    assert sweep.state == "cancelled"
    again = client.post(f"/sweeps/{sweep.pk}/cancel/", follow=True).content.decode()
    assert f"sweep {sweep.pk} is already cancelled" in again
