"""The what-if page: the form, the Celery task (run eagerly, the real task code), the report."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from portal.celery import app
from portal.whatif import available_policies

pytestmark = pytest.mark.django_db

TRACE = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n" + "".join(
    f"{i},{1 + i % 4},{i * 30},100,resnet50,{200 + 50 * i},0\n" for i in range(12)
)


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


@pytest.fixture
def eager() -> Iterator[None]:
    """Run Celery tasks in-process (no worker runs in the test suite)."""
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


def post(client: Client, commit: Any, **fields: Any) -> Any:
    data = {
        "source": "60_job",
        "policies": ["fifo", "tiresias"],
        "placements": ["count"],
        "leaves": "2",
        "total_gpus": "16",
        "gpus_per_server": "4",
        "duration_scale": "1",
        **fields,
    }
    with commit(execute=True):
        return client.post("/whatif/", data)


def test_tenants_get_404(alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    assert client.get("/whatif/").status_code == 404


def test_compare_policies_on_the_shared_trace(
    admin: Client, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    assert {"fifo", "tiresias"} <= set(available_policies())
    response = post(admin, django_capture_on_commit_callbacks)
    assert response.status_code == 302
    state = admin.get(response["Location"].rstrip("/") + ".json").json()
    assert state["status"] == "done" and state["progress"] == 1.0
    report = state["report"]
    assert [r["policy"] for r in report["results"]] == ["fifo", "tiresias"]
    fifo = report["results"][0]
    assert fifo["summary"]["jobs"] == report["jobs"] > 0
    assert fifo["jct_cdf"] == sorted(fifo["jct_cdf"])
    assert admin.get(response["Location"]).status_code == 200


def test_uploaded_trace_and_its_errors(
    admin: Client, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    bad = post(
        admin,
        django_capture_on_commit_callbacks,
        source="upload",
        upload=SimpleUploadedFile("t.csv", b"a,b\n1,2\n"),
    )
    assert bad.status_code == 400 and 'data-for="upload"' in bad.content.decode()
    missing = post(admin, django_capture_on_commit_callbacks, source="upload")
    assert 'data-for="upload"' in missing.content.decode()
    none = post(admin, django_capture_on_commit_callbacks, policies=[])
    assert 'data-for="policies"' in none.content.decode()
    good = post(
        admin,
        django_capture_on_commit_callbacks,
        source="upload",
        upload=SimpleUploadedFile("t.csv", TRACE.encode()),
        elastic="on",
    )
    state = admin.get(good["Location"].rstrip("/") + ".json").json()
    assert state["status"] == "done", state
    assert state["report"]["jobs"] == 12 and state["report"]["elastic"] is True


def test_placements_on_a_fabric(
    admin: Client, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    uneven = post(admin, django_capture_on_commit_callbacks, placements=["vclos"], leaves="3")
    assert 'data-for="leaves"' in uneven.content.decode()
    response = post(
        admin, django_capture_on_commit_callbacks, placements=["count", "vclos", "ecmp"]
    )
    state = admin.get(response["Location"].rstrip("/") + ".json").json()
    assert state["status"] == "done", state
    names = [r["policy"] for r in state["report"]["results"]]
    assert names == [
        "fifo",
        "fifo / vclos",
        "fifo / ecmp",
        "tiresias",
        "tiresias / vclos",
        "tiresias / ecmp",
    ]
    assert all(r["summary"]["jobs"] == state["report"]["jobs"] for r in state["report"]["results"])


def test_empty_history_fails_with_a_message(
    admin: Client, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    response = post(admin, django_capture_on_commit_callbacks, source="history")
    state = admin.get(response["Location"].rstrip("/") + ".json").json()
    assert state["status"] == "failed" and "no job" in state["error"]
    assert admin.get("/whatif/" + "0" * 32 + "/").status_code == 404
