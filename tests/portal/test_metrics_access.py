"""``/metrics``: a bearer token or an admin session; a fixed number of queries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools.job_steps import move
from jobs.services import check_job_spec, do_submit_job
from portal.metrics import bearer_token_matches
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-1234"


def scrape(**headers: str) -> Any:
    return Client(headers=headers).get("/metrics")


def finish_jobs(user: Any, tenant: Tenant, jcts: list[float]) -> None:
    """Completed jobs with the given completion times (seconds)."""
    start = timezone.now() - timedelta(days=2)
    for jct in jcts:
        spec = check_job_spec(
            tenant=tenant, data={"name": "m", "workload": "mlp-digits", "gpus": 1}
        )
        job = do_submit_job(user=user, tenant=tenant, spec=spec, at=start)
        move(job_id=job.pk, to_state="running", reason="t", at=start, parallelism=1)
        move(job_id=job.pk, to_state="completed", reason="t", at=start + timedelta(seconds=jct))


@override_settings(METRICS_TOKEN=TOKEN)
@pytest.mark.parametrize(
    ("header", "status"),
    [
        ({"Authorization": f"Bearer {TOKEN}"}, 200),
        ({"Authorization": f"bearer {TOKEN}"}, 200),
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Token {TOKEN}"}, 401),
        ({"Authorization": f"Bearer {TOKEN}x"}, 401),
        ({"Authorization": "Bearer "}, 401),
        ({"Authorization": "Bearer ü" * 1000}, 401),
    ],
)
def test_bearer_token(header: dict[str, str], status: int) -> None:
    response = scrape(**header)
    assert response.status_code == status
    if status == 401:
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'


@override_settings(METRICS_TOKEN="")
def test_without_a_token_only_admins_read_it(make_user: Callable[..., Any], alice: Any) -> None:
    assert scrape(Authorization="Bearer ").status_code == 401
    member = Client()
    member.force_login(alice)
    assert member.get("/metrics").status_code == 403
    admin = Client()
    admin.force_login(make_user("root", staff=True))
    response = admin.get("/metrics")
    assert response.status_code == 200 and b"portal_queue_length" in response.content


def test_bearer_token_matches_never_an_empty_token() -> None:
    assert not bearer_token_matches("Bearer ", "")
    assert not bearer_token_matches("", "")
    assert bearer_token_matches("Bearer abc", "abc")


def histogram(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith("portal_jct_seconds"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@override_settings(METRICS_TOKEN=TOKEN)
def test_jct_histogram_is_counted_by_the_database(alice: Any, acme: Tenant) -> None:
    finish_jobs(alice, acme, [10, 45, 45, 500, 100_000])
    values = histogram(scrape(Authorization=f"Bearer {TOKEN}").content.decode())
    assert values['portal_jct_seconds_bucket{le="30.0"}'] == 1
    assert values['portal_jct_seconds_bucket{le="60.0"}'] == 3
    assert values['portal_jct_seconds_bucket{le="600.0"}'] == 4
    assert values['portal_jct_seconds_bucket{le="86400.0"}'] == 4
    assert values['portal_jct_seconds_bucket{le="+Inf"}'] == 5
    assert values["portal_jct_seconds_count"] == 5
    assert values["portal_jct_seconds_sum"] == pytest.approx(10 + 45 + 45 + 500 + 100_000)


@override_settings(METRICS_TOKEN=TOKEN)
def test_queries_do_not_grow_with_finished_jobs(alice: Any, acme: Tenant) -> None:
    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert scrape(Authorization=f"Bearer {TOKEN}").status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    finish_jobs(alice, acme, [60.0] * 2)
    few = queries()
    finish_jobs(alice, acme, [60.0] * 30)
    assert len(queries()) == len(few) <= 10
    # Every query over jobs is an aggregate: no scrape reads the finished jobs row by row.
    over_jobs = [sql for sql in few if '"jobs_job"' in sql]
    assert over_jobs
    assert all("COUNT(" in sql or "SUM(" in sql for sql in over_jobs), over_jobs
