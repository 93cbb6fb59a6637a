"""The Prometheus endpoint reports the cluster as the database has it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from control.tick import run_tick
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or (
            line.startswith(name + "{") and line.split(" ")[0] == name
        ):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


def scraper() -> Client:
    """A Prometheus scraper with the configured bearer token."""
    return Client(headers={"Authorization": "Bearer scrape-secret"})


@override_settings(METRICS_TOKEN="scrape-secret")
def test_metrics_reflect_queue_and_gpus(alice: Any, acme: Any) -> None:
    demo_cluster()
    for gpus in (4, 4, 2):
        do_submit_job(
            user=alice,
            tenant=acme,
            spec=check_job_spec(
                tenant=acme, data={"name": "m", "workload": "mlp-digits", "gpus": gpus}
            ),
        )
    text = scraper().get("/metrics").content.decode()
    assert metric(text, "portal_queue_length") == 3
    assert metric(text, 'portal_gpus{state="idle"}') == 8
    run_tick(policy="fifo")
    text = scraper().get("/metrics").content.decode()
    assert metric(text, "portal_queue_length") == 1  # acme's quota of 8 holds back the third
    assert metric(text, 'portal_gpus{state="busy"}') == 8
    assert metric(text, 'portal_jobs{state="running"}') == 2
    assert metric(text, "portal_tick_count") >= 1
    assert "portal_jct_seconds_bucket" in text


@override_settings(METRICS_TOKEN="scrape-secret")
def test_environment_starts_by_hit_or_build_and_the_seconds_spent_building(
    alice: Any, acme: Any
) -> None:
    """Issue 36: counted from the starts' history notes, whatever else the history holds."""
    from control.reports import handle_report
    from jobs.agent_commands import runtime_job_name

    demo_cluster()
    job = do_submit_job(
        user=alice,
        tenant=acme,
        spec=check_job_spec(tenant=acme, data={"name": "m", "workload": "mlp-digits", "gpus": 2}),
    )
    key = "ab" * 16
    for n, (hit, seconds) in enumerate(((False, 4.25), (True, 0.0), (True, 0.0), (False, 1.5))):
        used = {"key": key, "hit": hit, "build_s": seconds, "packages": ["einops==0.8.1"]}
        handle_report({"type": "started", "node": "node-0", "job": runtime_job_name(job.pk),
                       "command_id": f"c-{n}", "workers": [], "environment": used})  # fmt: skip
    handle_report({"type": "started", "node": "node-0", "job": runtime_job_name(job.pk),
                   "command_id": "c-9", "workers": []})  # fmt: skip
    text = scraper().get("/metrics").content.decode()
    assert metric(text, 'portal_environment_starts_total{result="hit"}') == 2
    assert metric(text, 'portal_environment_starts_total{result="built"}') == 2
    assert metric(text, "portal_environment_build_seconds_total") == 5.75
