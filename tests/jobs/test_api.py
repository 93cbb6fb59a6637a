"""The jobs REST API: submission rules, filtering, paging, cancel, updates, tenant isolation."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from devtools.job_steps import move
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from tenancy.models import Role
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


def submit(client: APIClient, **overrides: Any) -> Any:
    return client.post("/api/v1/jobs/", job_body(**overrides), format="json")


def test_submit_queues_job_with_defaults(token_client: Any, alice: Any) -> None:
    response = submit(token_client(alice))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "queued"
    assert body["tenant"] == "acme"
    assert (body["gpus"], body["min_gpus"], body["max_gpus"]) == (2, 2, 2)
    assert body["batch_size"] == 64  # the workload's default
    assert body["args"]["epochs"] == 20  # defaults filled in
    assert body["parallelism"] == 0
    assert body["submitted_at"] and body["started_at"] is None
    kinds = list(Job.objects.get(pk=body["id"]).events.values_list("kind", "to_state"))
    assert kinds == [("submitted", "pending"), ("state", "queued")]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpus": -1}, "gpus"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": "many"}, "gpus"),
        ({"gpus": 2.5}, "gpus"),
        ({"min_gpus": 4, "max_gpus": 2, "gpus": 2}, "min_gpus"),
        ({"min_gpus": 1, "max_gpus": 2, "gpus": 4}, "gpus"),
        ({"gpus": 9, "max_gpus": 9}, "gpus"),  # acme's quota is 8
        ({"workload": "bitcoin-miner"}, "workload"),
        ({"args": {"epochs": -3}}, "args"),
        ({"args": {"nonsense": 1}}, "args"),
        ({"args": {"epochs": "x" * 5000}}, "args"),
        ({"args": [1, 2]}, "args"),
        ({"name": ""}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "x" * 100_000}, "name"),
        ({"priority": 101}, "priority"),
        ({"recovery": "pray"}, "recovery"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2, "gpus": 2, "max_gpus": 4}, "batch_size"),
        ({"checkpoint_interval": 0}, "checkpoint_interval"),
    ],
)
def test_invalid_submissions_are_400_and_change_nothing(
    token_client: Any, alice: Any, overrides: dict[str, Any], field: str
) -> None:
    response = submit(token_client(alice), **overrides)
    assert response.status_code == 400
    body = response.json()
    assert body["message"]
    assert field in body["errors"], body
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


def test_unknown_fields_and_non_objects_are_refused(token_client: Any, alice: Any) -> None:
    client = token_client(alice)
    response = submit(client, colour="blue")
    assert response.status_code == 400
    assert "colour" in response.json()["message"]
    response = client.post("/api/v1/jobs/", [job_body()], format="json")
    assert response.status_code == 400
    response = client.post("/api/v1/jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400 and "message" in response.json()
    assert Job.objects.count() == 0


def test_viewer_cannot_submit_and_multi_tenant_user_must_choose(
    token_client: Any, make_user: Any, acme: Any, globex: Any
) -> None:
    viewer = make_user("vic", acme, role=Role.VIEWER)
    response = submit(token_client(viewer))
    assert response.status_code == 400
    assert "no tenant" in response.json()["message"]

    both = make_user("carol", acme)
    from tenancy.services import do_add_member

    do_add_member(tenant=globex, user=both)
    client = token_client(both)
    assert submit(client).status_code == 400
    response = submit(client, tenant="globex")
    assert response.status_code == 201
    assert response.json()["tenant"] == "globex"
    assert submit(client, tenant="initech").status_code == 400


def test_authentication_required_with_json_errors() -> None:
    response = APIClient().get("/api/v1/jobs/")
    assert response.status_code in (401, 403)
    assert "message" in response.json()
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert bad.get("/api/v1/jobs/").status_code == 401


def test_tenant_isolation(token_client: Any, alice: Any, bob: Any) -> None:
    a, b = token_client(alice), token_client(bob)
    alice_job = submit(a, name="secret").json()["id"]
    bob_job = submit(b).json()["id"]
    assert [j["id"] for j in a.get("/api/v1/jobs/").json()["results"]] == [alice_job]
    assert [j["id"] for j in b.get("/api/v1/jobs/").json()["results"]] == [bob_job]
    for method, url in [
        ("get", f"/api/v1/jobs/{alice_job}/"),
        ("get", f"/api/v1/jobs/{alice_job}/events/"),
        ("post", f"/api/v1/jobs/{alice_job}/cancel/"),
        ("patch", f"/api/v1/jobs/{alice_job}/"),
    ]:
        response = getattr(b, method)(
            url, {"priority": 1} if method == "patch" else {}, format="json"
        )
        assert response.status_code == 404, (method, url)
        assert response.json()["message"] == "Not found."
    job = Job.objects.get(pk=alice_job)
    assert job.state == JobState.QUEUED and job.priority == 50
    assert b.get("/api/v1/jobs/?tenant=acme").json()["count"] == 0
    assert [t["slug"] for t in b.get("/api/v1/tenants/").json()["results"]] == ["globex"]
    assert b.get("/api/v1/tenants/acme/").status_code == 404


def test_admin_sees_every_tenant(token_client: Any, alice: Any, bob: Any, make_user: Any) -> None:
    submit(token_client(alice))
    submit(token_client(bob))
    admin = make_user("root", staff=True)
    assert token_client(admin).get("/api/v1/jobs/").json()["count"] == 2


def test_filter_by_state_and_paging(token_client: Any, alice: Any) -> None:
    client = token_client(alice)
    ids = [submit(client, name=f"j{i}").json()["id"] for i in range(5)]
    move(job_id=ids[0], to_state=JobState.RUNNING, reason="test", parallelism=2)
    running = client.get("/api/v1/jobs/?state=running").json()
    assert [j["id"] for j in running["results"]] == [ids[0]]
    both = client.get("/api/v1/jobs/?state=running,queued").json()
    assert both["count"] == 5
    assert client.get("/api/v1/jobs/?state=flying").status_code == 400
    page = client.get("/api/v1/jobs/?page_size=2&page=2").json()
    assert page["count"] == 5 and len(page["results"]) == 2
    assert client.get("/api/v1/jobs/?page=99").status_code == 404


def test_cancel_and_cancel_twice(token_client: Any, alice: Any) -> None:
    client = token_client(alice)
    job_id = submit(client).json()["id"]
    response = client.post(
        f"/api/v1/jobs/{job_id}/cancel/", {"reason": "changed my mind"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert response.json()["finished_at"]
    again = client.post(f"/api/v1/jobs/{job_id}/cancel/", format="json")
    assert again.status_code == 409
    assert "already cancelled" in again.json()["message"]
    events = client.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]
    assert events[-1]["to_state"] == "cancelled" and events[-1]["reason"] == "changed my mind"


def test_viewer_cannot_cancel(token_client: Any, alice: Any, make_user: Any, acme: Any) -> None:
    job_id = submit(token_client(alice)).json()["id"]
    viewer = make_user("vic", acme, role=Role.VIEWER)
    response = token_client(viewer).post(f"/api/v1/jobs/{job_id}/cancel/", format="json")
    assert response.status_code == 403
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_change_priority_and_range(token_client: Any, alice: Any) -> None:
    client = token_client(alice)
    job_id = submit(client, gpus=2, min_gpus=1, max_gpus=4).json()["id"]
    response = client.patch(
        f"/api/v1/jobs/{job_id}/", {"priority": 90, "max_gpus": 8}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert (response.json()["priority"], response.json()["max_gpus"]) == (90, 8)
    kinds = [e["kind"] for e in client.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]]
    assert kinds[-2:] == ["priority", "range"]
    for bad in ({"min_gpus": 3}, {"max_gpus": 1}, {"priority": -1}, {"gpus": 3}, {"max_gpus": 65}):
        response = client.patch(f"/api/v1/jobs/{job_id}/", bad, format="json")
        assert response.status_code == 400, bad
    job = Job.objects.get(pk=job_id)
    assert (job.min_gpus, job.max_gpus, job.priority) == (1, 8, 90)


def test_me_and_stats(token_client: Any, alice: Any, make_user: Any) -> None:
    client = token_client(alice)
    me = client.get("/api/v1/me/").json()
    assert me["username"] == "alice"
    assert me["memberships"] == [{"tenant": "acme", "role": "member"}]
    stats = client.get("/api/v1/stats/jct/?tenant=acme").json()
    assert stats == {"scope": "acme", "count": 0, "mean": None, "median": None, "p95": None}
    assert client.get("/api/v1/stats/jct/?tenant=globex").status_code == 404
    assert client.get("/api/v1/stats/jct/").status_code == 403
    admin = make_user("root", staff=True)
    assert token_client(admin).get("/api/v1/stats/jct/").json()["scope"] == "cluster"


def test_unknown_api_url_is_json_404(token_client: Any, alice: Any) -> None:
    response = token_client(alice).get("/api/v1/nothing-here/")
    assert response.status_code == 404
    assert response.json()["message"] == "Not found."
