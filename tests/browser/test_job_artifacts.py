"""A tenant downloads a finished job's final checkpoint from the job page; it loads as the model."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

FINAL_PATH = "checkpoints/step-000000100.pt"


def store_final(job: int, local: str, step: int) -> str:
    """(Run in the driver.) Put ``local`` into the server's store as the job's final checkpoint.

    The object goes where the runtime writes it and the row comes from an
    ``artifact_stored`` report through the control plane, as in production.
    """
    from control.reports import handle_report
    from jobs.agent_commands import runtime_job_name
    from jobs.artifacts import artifact_store, job_prefix
    from jobs.models import Job
    from workers.protocol import ArtifactStored

    data = Path(local).read_bytes()
    slug = Job.objects.select_related("tenant").get(pk=job).tenant.slug
    artifact_store().put_file(f"{job_prefix(slug, job)}/{FINAL_PATH}", Path(local))
    report = ArtifactStored(
        node="node-0",
        job=runtime_job_name(job),
        event_id=f"1700000000000-{job}",
        kind="final",
        path=FINAL_PATH,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        step=step,
    )
    return handle_report(report.to_dict())


def log_metrics(job: int, points: list[tuple[int, dict[str, float]]]) -> str:
    """(Run in the driver.) A ``metrics`` report of the job's program, through the control plane."""
    from control.reports import handle_report
    from jobs.agent_commands import runtime_job_name
    from workers.protocol import MetricPoint, Metrics

    report = Metrics(
        node="node-0",
        job=runtime_job_name(job),
        event_id=f"1700000000001-{job}",
        points=tuple(MetricPoint(step=step, values=values) for step, values in points),
    )
    return handle_report(report.to_dict())


def test_a_tenant_downloads_the_final_checkpoint_and_it_loads_as_the_model(
    browser: Any, server: Server, driver: Driver, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    local = tmp_path / "final.pt"
    torch.save(model.state_dict(), local)

    # a tenant of its own, so that the other browser tests' counts stay theirs
    driver(
        "call",
        path="tenancy.services:do_create_tenant",
        kwargs={"slug": "initech", "name": "Initech", "owner_username": "ivy", "password": "pw"},
    )
    job = driver("submit", user="ivy", tenant="initech", name="ckpt-download", gpus=1)["job"]
    driver("transition", job=job, state="running", parallelism=1)
    outcome = driver(
        "call",
        path="tests.browser.test_job_artifacts:store_final",
        kwargs={"job": job, "local": str(local), "step": 100},
    )
    assert outcome["repr"] == "'artifact'"
    for step in (20, 60, 100):
        driver("report", kind="progress", job=job, step=step, samples_per_s=900.0, world=1,
               loss=2.0 / step)  # fmt: skip
    points = [(step, {"accuracy": step / 100, "lr": 0.1}) for step in (20, 60, 100)]
    outcome = driver(
        "call",
        path="tests.browser.test_job_artifacts:log_metrics",
        kwargs={"job": job, "points": points},
    )
    assert outcome["repr"] == "'metrics'"
    driver("transition", job=job, state="completed", reason="training finished at step 100")

    page = login(browser, server, "ivy")
    page.goto(f"/jobs/{job}/")
    row = page.locator("#artifacts-body tr.artifact-final")
    row.wait_for()
    assert "step-000000100.pt" in row.inner_text()
    # loss and the logged metrics are drawn next to the other charts
    page.wait_for_function("() => document.querySelector('#chart-loss .main-svg')")
    page.wait_for_function(
        "() => document.querySelectorAll('#chart-metrics .scatterlayer .trace').length === 2"
    )
    with page.expect_download() as info:
        row.locator("a.artifact-download").click()
    download = info.value
    assert download.suggested_filename == "step-000000100.pt"
    got = torch.load(download.path(), map_location="cpu")
    expected = model.state_dict()
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name

    # another tenant's member finds neither the page nor the download
    other = login(browser, server, "bob")
    assert other.goto(f"/jobs/{job}/").status == 404
    href = row.locator("a.artifact-download").get_attribute("href")
    assert other.request.get(server.url + href).status == 404
    page.context.close()
    other.context.close()
