"""Admin pages: the cluster view's data and the topology editor's forms and refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from scheduler.curves import gpu_efficiency, speedup
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db

SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


def generate(client: Client, **overrides: Any) -> Any:
    return client.post(
        "/cluster/topology/", {"form": "generate", **SPEC, "link_gbps": "100", **overrides}
    )


def test_admin_pages_are_404_for_tenants(alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    for url in (
        "/cluster/",
        "/cluster/topology/",
        "/live/cluster.json",
        "/cluster/topology/export.json",
    ):
        assert client.get(url).status_code == 404, url


def test_generate_export_and_reimport(admin: Client) -> None:
    assert b"No topology yet" in admin.get("/cluster/").content
    response = generate(admin)
    assert response.status_code == 302
    assert Server.objects.count() == 4
    exported = admin.get("/cluster/topology/export.json")
    assert exported["Content-Disposition"].startswith("attachment")
    document = json.loads(exported.content)
    assert {k: document[k] for k in SPEC} == SPEC and len(document["servers"]) == 4
    page = admin.post("/cluster/topology/", {"form": "import", "document": json.dumps(document)})
    assert page.status_code == 302
    assert "nothing changed" in admin.get("/cluster/topology/").content.decode()


def test_bad_specs_show_errors_next_to_their_fields(admin: Client) -> None:
    page = generate(admin, spines="3")  # 4 uplinks per leaf cannot spread over 3 spines
    assert page.status_code == 400
    html = page.content.decode()
    assert 'data-for="spines"' in html and "spines" in html
    assert Server.objects.count() == 0
    page = generate(admin, leaves="0")
    assert 'data-for="leaves"' in page.content.decode()
    page = admin.post("/cluster/topology/", {"form": "import", "document": "{nope"})
    assert page.status_code == 400 and 'data-for="document"' in page.content.decode()
    page = admin.post("/cluster/topology/", {"form": "import", "document": '{"leaves": 2}'})
    assert page.status_code == 400 and 'data-for="document"' in page.content.decode()


def test_changes_that_would_orphan_running_jobs_are_refused(admin: Client, acme: Tenant) -> None:
    generate(admin)
    owner = acme.memberships.get().user
    spec = check_job_spec(
        tenant=acme, data={"name": "wide", "workload": "mlp-digits", "gpus": 8, "max_gpus": 8}
    )
    job = do_submit_job(user=owner, tenant=acme, spec=spec)
    for node in Server.objects.values_list("node", flat=True):
        do_heartbeat(node=node, info={})  # agents are alive: their GPUs are schedulable
    result = run_tick(policy="fifo")
    assert result.ran, result
    job.refresh_from_db()
    assert job.state == "running" and job.parallelism == 8, result

    snapshot = admin.get("/live/cluster.json").json()
    held = [g for g in snapshot["gpus"] if g[4] == job.pk]
    assert len(held) == 8 and snapshot["totals"]["allocated"] == 8
    assert all(c[3] == job.pk for c in snapshot["cables"]) and snapshot["cables"]
    assert snapshot["timeline"]["gpus_in_use"][-1] == 8
    assert snapshot["jobs"][str(job.pk)]["tenant"] == "acme"

    response = admin.post("/cluster/topology/servers/node-0/remove/", follow=True)
    assert "drain it first" in response.content.decode()
    assert Server.objects.filter(node="node-0").exists()
    page = generate(admin, leaves="3")
    assert page.status_code == 400 and "orphan" in page.content.decode()
    admin.post("/cluster/topology/servers/node-0/drain/")
    assert Server.objects.get(node="node-0").state == "draining"
    admin.post("/cluster/topology/servers/node-0/undrain/")
    assert Server.objects.get(node="node-0").state == "up"
    assert Job.objects.get(pk=job.pk).state == "running"


def test_add_server_errors_and_success(admin: Client) -> None:
    generate(admin)
    admin.post("/cluster/topology/servers/node-3/remove/")
    page = admin.post(
        "/cluster/topology/", {"form": "server", "leaf": "0", "slot": "0", "node": "x"}
    )
    assert page.status_code == 400 and "already has a server" in page.content.decode()
    page = admin.post(
        "/cluster/topology/", {"form": "server", "leaf": "9", "slot": "0", "node": "x"}
    )
    assert 'data-for="leaf"' in page.content.decode()
    ok = admin.post(
        "/cluster/topology/", {"form": "server", "leaf": "1", "slot": "1", "node": "n9"}
    )
    assert ok.status_code == 302 and Server.objects.filter(node="n9").exists()


def test_speedup_uses_the_profile_or_assumes_linear() -> None:
    assert speedup(None, 4) == 4.0
    curve = {"1": 100.0, "2": 180.0, "4": 300.0}
    assert speedup(curve, 2) == pytest.approx(1.8)
    assert speedup(curve, 3) == pytest.approx(2.4)
    assert speedup(curve, 0) == 0.0


def test_gpu_efficiency_measured_or_profiled() -> None:
    curve = {"1": 100.0, "2": 180.0, "4": 300.0}
    assert gpu_efficiency(curve, 4, 280.0) == 0.7  # measured 280/s over 4 x 100/s
    assert gpu_efficiency(curve, 4, None) == 0.75  # the profile's 300/(4 x 100)
    assert gpu_efficiency(None, 4, 280.0) is None
    assert gpu_efficiency(curve, 1, 150.0) == 1.0  # capped
