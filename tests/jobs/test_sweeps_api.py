"""The sweeps API and ``resume_from`` on the jobs API, through the real URL, token and JSON
paths: a tenant sees only its own sweeps (another's is a 404), every bad field is a 400
that names it and creates nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jobs.artifacts import artifact_store, prefix_of
from jobs.models import Job, Sweep
from tests.jobs.test_programs import bundle_of, program_body
from workers.elastic.checkpoint import Checkpoints

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


def body(user: Any, tenant: Any, **overrides: Any) -> dict[str, Any]:
    bundle = bundle_of(user, tenant)
    fields: dict[str, Any] = {
        "name": "search",
        "gpus": 1,
        "search_space": {
            "lr": {"type": "loguniform", "low": 1e-4, "high": 0.1},
            "width": {"type": "grid", "values": [16, 32]},
        },
        "metric": "val/loss",
        "strategy": "asha",
        "eta": 3,
        "min_steps": 10,
        "max_steps": 90,
        "max_trials": 3,
        "seed": 5,
    }
    return program_body(bundle.sha256, **{**fields, **overrides})


def test_a_sweep_is_created_listed_shown_and_cancelled(
    token_client: Any, alice: Any, acme: Any
) -> None:
    client = token_client(alice)
    created = client.post("/api/v1/sweeps/", body(alice, acme), format="json")
    assert created.status_code == 201, created.json()
    sweep = created.json()
    assert (sweep["strategy"], sweep["eta"], sweep["state"], sweep["tenant"]) == (
        "asha", 3, "running", "acme",
    )  # fmt: skip
    assert [t["index"] for t in sweep["trials"]] == [0, 1, 2]
    assert [t["params"]["width"] for t in sweep["trials"]] == [16, 32, 16]
    assert all(1e-4 <= t["params"]["lr"] <= 0.1 for t in sweep["trials"])
    assert {(t["status"], t["rung"], t["job_state"]) for t in sweep["trials"]} == {
        ("running", 0, "queued")
    }
    assert sweep["best"] is None
    job = client.get(f"/api/v1/jobs/{sweep['trials'][1]['job']}/").json()
    assert job["env"]["HP_WIDTH"] == "32" and job["env"]["TRIAL_MAX_STEPS"] == "10"
    assert (job["trial"], job["sched_weight"]) == (
        Sweep.objects.get().trials.get(index=1).pk, 1.0,
    )  # fmt: skip
    again = client.post("/api/v1/sweeps/", body(alice, acme), format="json").json()
    assert again["trials"][0]["params"] == sweep["trials"][0]["params"]  # same seed, same
    listed = client.get("/api/v1/sweeps/").json()
    assert [s["id"] for s in listed["results"]] == [again["id"], sweep["id"]]
    shown = client.get(f"/api/v1/sweeps/{sweep['id']}/").json()
    assert shown["trials"] == sweep["trials"]
    cancelled = client.post(f"/api/v1/sweeps/{sweep['id']}/cancel/", {}, format="json")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert {(t["status"], t["job_state"]) for t in cancelled.json()["trials"]} == {
        ("stopped", "cancelled")
    }
    assert (
        client.post(f"/api/v1/sweeps/{sweep['id']}/cancel/", {}, format="json").status_code == 409
    )


def test_another_tenants_sweep_is_not_found(
    token_client: Any, alice: Any, acme: Any, bob: Any
) -> None:
    sweep = token_client(alice).post("/api/v1/sweeps/", body(alice, acme), format="json").json()
    theirs = token_client(bob)
    assert theirs.get(f"/api/v1/sweeps/{sweep['id']}/").status_code == 404
    assert (
        theirs.post(f"/api/v1/sweeps/{sweep['id']}/cancel/", {}, format="json").status_code == 404
    )
    assert theirs.get("/api/v1/sweeps/").json()["results"] == []
    assert Sweep.objects.get().state == "running"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"strategy": "hyperband"}, "strategy"),
        ({"eta": 1}, "eta"),
        ({"min_steps": 100}, "min_steps"),
        ({"search_space": {"lr": {"type": "loguniform", "low": -1, "high": 1}}},
         "search_space.lr"),
        ({"search_space": "lr=0.1"}, "search_space"),
        ({"metric": "bad metric"}, "metric"),
        ({"resume_from": 1}, "resume_from"),
        ({"workload": "mlp-digits", "code": None, "entrypoint": None}, "workload"),
    ],
)  # fmt: skip
def test_a_bad_sweep_is_a_400_naming_the_field(
    token_client: Any, alice: Any, acme: Any, overrides: dict[str, Any], field: str
) -> None:
    sent = {k: v for k, v in {**body(alice, acme), **overrides}.items() if v is not None}
    response = token_client(alice).post("/api/v1/sweeps/", sent, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()
    assert not Sweep.objects.exists() and not Job.objects.exists()


def test_resume_from_another_tenants_job_is_a_400_like_a_missing_one(
    token_client: Any, alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    mine = token_client(alice).post(
        "/api/v1/jobs/", program_body(bundle_of(alice, acme).sha256, gpus=1), format="json"
    )
    source = Job.objects.get(pk=mine.json()["id"])
    Checkpoints(artifact_store().child(prefix_of(source))).save(7, {"w": torch.zeros(1)})
    resumed = token_client(alice).post(
        "/api/v1/jobs/",
        {**program_body(bundle_of(alice, acme).sha256, gpus=1), "resume_from": source.pk},
        format="json",
    )
    assert resumed.status_code == 201, resumed.json()
    assert (resumed.json()["resumed_from"], resumed.json()["step"]) == (source.pk, 7)
    foreign = token_client(bob).post(
        "/api/v1/jobs/",
        {**program_body(bundle_of(bob, globex).sha256, gpus=1), "resume_from": source.pk},
        format="json",
    )
    missing = token_client(bob).post(
        "/api/v1/jobs/",
        {**program_body(bundle_of(bob, globex).sha256, gpus=1), "resume_from": 999999},
        format="json",
    )
    assert foreign.status_code == missing.status_code == 400
    assert foreign.json()["errors"]["resume_from"] == [f"No job {source.pk} in tenant globex."]
    assert missing.json()["errors"]["resume_from"] == ["No job 999999 in tenant globex."]
    assert Job.objects.filter(tenant=globex).count() == 0
