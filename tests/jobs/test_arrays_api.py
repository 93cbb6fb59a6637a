"""The arrays API and ``after`` on the jobs API, through the real URL, token and JSON paths:
a tenant sees only its own arrays (another's is a 404), every bad field is a 400 that
names it and creates nothing."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Job, JobArray
from tests.jobs.test_programs import bundle_of, program_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


def body(user: Any, tenant: Any, **overrides: Any) -> dict[str, Any]:
    bundle = bundle_of(user, tenant)
    fields: dict[str, Any] = {"name": "grid", "gpus": 1, "size": 4, "max_running": 2}
    return program_body(bundle.sha256, **{**fields, **overrides})


def test_an_array_is_created_listed_shown_cancelled(
    token_client: Any, alice: Any, acme: Any
) -> None:
    client = token_client(alice)
    created = client.post("/api/v1/arrays/", body(alice, acme), format="json")
    assert created.status_code == 201, created.json()
    array = created.json()
    assert (array["size"], array["max_running"], array["tenant"]) == (4, 2, "acme")
    assert array["counts"] == {"queued": 2, "pending": 2}
    assert [t["task_id"] for t in array["tasks"]] == [0, 1, 2, 3]
    assert array["tasks"][2]["wait_reason"].startswith("waits for a slot")
    listed = client.get("/api/v1/arrays/").json()
    assert [a["id"] for a in listed["results"]] == [array["id"]]
    assert listed["results"][0]["counts"] == {"queued": 2, "pending": 2}
    task = client.get(f"/api/v1/jobs/{array['tasks'][0]['job']}/").json()
    assert (task["array"], task["array_index"]) == (array["id"], 0)
    assert task["env"]["TASK_ID"] == "0" and task["env"]["TASK_COUNT"] == "4"
    jobs = client.get(f"/api/v1/jobs/?array={array['id']}").json()
    assert jobs["count"] == 4
    cancelled = client.post(f"/api/v1/arrays/{array['id']}/cancel/", {}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["counts"] == {"cancelled": 4}
    again = client.post(f"/api/v1/arrays/{array['id']}/cancel/", {}, format="json")
    assert again.status_code == 409
    retried = client.post(f"/api/v1/arrays/{array['id']}/retry/", {}, format="json")
    assert retried.status_code == 409  # nothing failed


def test_another_tenants_array_is_not_found(
    token_client: Any, alice: Any, acme: Any, bob: Any
) -> None:
    created = token_client(alice).post("/api/v1/arrays/", body(alice, acme), format="json")
    array = created.json()["id"]
    theirs = token_client(bob)
    assert theirs.get(f"/api/v1/arrays/{array}/").status_code == 404
    assert theirs.get("/api/v1/arrays/").json()["results"] == []
    assert theirs.post(f"/api/v1/arrays/{array}/cancel/", {}, format="json").status_code == 404
    assert theirs.post(f"/api/v1/arrays/{array}/retry/", {}, format="json").status_code == 404
    assert Job.objects.filter(array_id=array, state="cancelled").count() == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"size": 0}, "size"),
        ({"max_running": 0}, "max_running"),
        ({"env": {"TASK_ID": "1"}}, "env"),
        ({"after": [{"kind": "after_soon", "job": 1}]}, "after[0].kind"),
        ({"after": [{"kind": "after_ok", "job": 10**9}]}, "after[0].job"),
        ({"colour": "red"}, "non_field_errors"),
    ],
)
def test_a_bad_array_is_a_400_naming_the_field(
    token_client: Any, alice: Any, acme: Any, overrides: dict[str, Any], field: str
) -> None:
    response = token_client(alice).post(
        "/api/v1/arrays/", body(alice, acme, **overrides), format="json"
    )
    assert response.status_code == 400, response.json()
    assert field in str(response.json())
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_after_on_the_jobs_api(
    token_client: Any, alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    theirs = token_client(bob).post(
        "/api/v1/jobs/", program_body(bundle_of(bob, globex).sha256, gpus=1), format="json"
    )
    client = token_client(alice)
    code = bundle_of(alice, acme).sha256
    first = client.post("/api/v1/jobs/", program_body(code, gpus=1), format="json").json()
    waiting = client.post(
        "/api/v1/jobs/",
        program_body(code, gpus=1, after=[{"kind": "after_ok", "job": first["id"]}]),
        format="json",
    )
    assert waiting.status_code == 201, waiting.json()
    shown = waiting.json()
    assert shown["state"] == "pending" and shown["after"] == [
        {"kind": "after_ok", "job": first["id"]}
    ]
    assert shown["wait_reason"] == f"waits for job {first['id']} to complete"
    listed = client.get("/api/v1/jobs/?state=pending").json()["results"]
    assert [j["after"] for j in listed] == [[{"kind": "after_ok", "job": first["id"]}]]
    answers = []
    for target in (theirs.json()["id"], 10**9):
        refused = client.post(
            "/api/v1/jobs/",
            program_body(code, gpus=1, after=[{"kind": "after_ok", "job": target}]),
            format="json",
        )
        assert refused.status_code == 400
        answers.append(str(refused.json()).replace(str(target), "N"))
    assert answers[0] == answers[1]
    assert Job.objects.filter(tenant=acme).count() == 2


def test_a_waiting_jobs_dependencies_change_but_never_into_a_cycle(
    token_client: Any, alice: Any, acme: Any
) -> None:
    client = token_client(alice)
    code = bundle_of(alice, acme).sha256

    def submit(after: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        response = client.post(
            "/api/v1/jobs/", program_body(code, gpus=1, after=after), format="json"
        )
        assert response.status_code == 201, response.json()
        return dict(response.json())

    first = submit()
    a = submit([{"kind": "after_ok", "job": first["id"]}])
    b = submit([{"kind": "after_ok", "job": a["id"]}])
    loop = client.patch(f"/api/v1/jobs/{a['id']}/", {"after": [{"kind": "after_any", "job": b["id"]}],
                        "priority": 90}, format="json")  # fmt: skip
    assert loop.status_code == 400
    assert loop.json()["errors"]["after"] == [
        f"A cycle: job {a['id']} → job {b['id']} → job {a['id']}."
    ]
    unchanged = client.get(f"/api/v1/jobs/{a['id']}/").json()
    assert unchanged["after"] == [{"kind": "after_ok", "job": first["id"]}]
    assert unchanged["priority"] == 50  # nothing changed
    queued = client.patch(f"/api/v1/jobs/{first['id']}/", {"after": []}, format="json")
    assert queued.status_code == 400 and "after" in queued.json()["errors"]  # not waiting
    freed = client.patch(f"/api/v1/jobs/{a['id']}/", {"after": []}, format="json")
    assert freed.status_code == 200, freed.json()
    assert (freed.json()["state"], freed.json()["after"]) == ("queued", [])
