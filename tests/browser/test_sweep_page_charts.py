"""The sweep page in headless Chromium: both charts drawn (every axis titled), under the
Content-Security-Policy (no inline script), the best trial's checkpoint linked.

``demo_sweep`` builds the sweep in the browser portal's own process (the driver's ``call``
op): a grid of three learning rates whose jobs log their loss and complete through the
lifecycle, so the sweep records their results and promotes the best."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, assert_all_titled, chart_axes, login

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def demo_sweep() -> int:
    """A sweep of acme (alice) with three trials at rung 0 done and the best promoted."""
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.utils import timezone

    from bundles.services import do_upload
    from devtools.job_steps import move
    from jobs.sweeps import check_sweep_spec, do_submit_sweep
    from jobs.training_metrics import add_points
    from tenancy.models import Tenant
    from workers.protocol import MetricPoint

    alice, acme = get_user_model().objects.get(username="alice"), Tenant.objects.get(slug="acme")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"\n"))
    bundle, _ = do_upload(
        user=alice, tenant=acme, uploaded_file=SimpleUploadedFile("c.tgz", buf.getvalue())
    )
    data = {"name": "lr-page", "code": bundle.sha256, "entrypoint": "train.py", "gpus": 1,
            "launcher": "torchrun", "search_space": {"lr": {"type": "grid", "values": [0.3, 0.1, 0.2]},
                                                     "act": {"type": "choice", "values": ["relu", "tanh"]}},
            "metric": "loss", "strategy": "asha", "eta": 2, "min_steps": 10, "max_steps": 40,
            "max_trials": 3}  # fmt: skip
    sweep = do_submit_sweep(user=alice, tenant=acme, spec=check_sweep_spec(tenant=acme, data=data))
    for trial in sweep.trials.order_by("index"):
        job = trial.job
        assert job is not None
        move(job_id=job.pk, to_state="running", reason="test", parallelism=1)
        lr = float(trial.params["lr"])
        points = [MetricPoint(step=s, values={"loss": abs(lr - 0.1) + 1 / s}) for s in (5, 10)]
        add_points(job, points, timezone.now())
        move(job_id=job.pk, to_state="completed", reason="test")
    return sweep.pk


def test_the_sweep_page_draws_its_charts(browser: Any, server: Server, driver: Driver) -> None:
    answer = driver("call", path="tests.browser.test_sweep_page_charts:demo_sweep")
    sweep = int(answer["repr"])
    alice = login(browser, server, "alice")
    alice.goto(f"/sweeps/{sweep}/")
    alice.wait_for_selector("#sweep-curves .js-plotly-plot, #sweep-curves.js-plotly-plot")
    alice.wait_for_selector("#sweep-parcoords.js-plotly-plot")
    charts = chart_axes(alice)
    assert_all_titled(charts, {"sweep-curves"})
    assert charts["sweep-curves"]["xaxis"] == "Step"
    traces = alice.evaluate("() => document.getElementById('sweep-curves').data.length")
    assert traces == 3  # one line per trial
    dims = alice.evaluate(
        "() => document.getElementById('sweep-parcoords').data[0].dimensions.map(d => d.label)"
    )
    assert dims == ["act", "lr", "loss"]
    assert "Trial <strong>1</strong>" in alice.content()
    rows = alice.locator("#sweep-trials tbody tr").count()
    assert rows == 3
    bob = login(browser, server, "bob")
    assert bob.goto(f"/sweeps/{sweep}/").status == 404
