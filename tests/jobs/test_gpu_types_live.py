"""Issue 38's live wiring: jobs that ask for GPU types, a node selector, CPU and memory,
refused at submit when no server could ever hold them, and placed by the real tick on
the two-type demo cluster (``portal.demo.two_type_fabric``) on their own type only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from control import incremental
from control.forecast import compute_forecast
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_set_server_state
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from jobs.usage import decayed_usage_by_tenant, usage_report
from portal.demo import DEMO_FABRIC, demo_fabric, ensure_demo_fabric, two_type_fabric
from tests.cli.in_process import env, run, store  # noqa: F401 (fixtures)
from tests.conftest import job_body
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

A100, H100 = "a100-40g", "h100-80g"


def _two_types() -> list[str]:
    """The two-type demo cluster loaded, every agent alive."""
    return demo_cluster(two_type_fabric())  # type: ignore[arg-type]


def _types_of(job: Job) -> set[str]:
    """The GPU types of the servers ``job`` holds GPUs on."""
    return set(
        Server.objects.filter(gpu_set__assignment__job=job).values_list("gpu_type", flat=True)
    )


def _submit(user: Any, tenant: Any, **fields: Any) -> Job:
    data = {"name": "t", "workload": "mlp-digits", "gpus": 2, **fields}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def _post(client: Any, **fields: Any) -> Any:
    return client.post("/api/v1/jobs/", job_body(**fields), format="json")


def _errors(response: Any) -> dict[str, Any]:
    """A 400's errors by field."""
    assert response.status_code == 400, response.content
    return dict(response.json()["errors"])


def test_a_selector_no_server_matches_is_refused_at_submit_naming_node_selector(
    alice: Any, token_client: Any
) -> None:
    _two_types()
    client = token_client(alice)
    response = _post(client, gpu_types=[H100], node_selector={"pool": "nowhere"})
    assert "pool=nowhere" in str(_errors(response)["node_selector"])
    assert not Job.objects.exists()


def test_a_type_the_cluster_lacks_and_too_many_gpus_of_one_type_are_refused(
    alice: Any, token_client: Any, acme: Any
) -> None:
    _two_types()
    acme.gpu_quota = 16
    acme.save()
    client = token_client(alice)
    missing = _post(client, gpu_types=["v100-16g"])
    assert "no server has GPUs of v100-16g" in str(_errors(missing)["gpu_types"])
    # 4 A100s and 4 H100s: 8 GPUs of one type never exist, though 8 GPUs do
    straddling = _post(client, gpus=8, min_gpus=8, max_gpus=8)
    assert "the most there are is 4" in str(_errors(straddling)["min_gpus"])
    assert not Job.objects.exists()


def test_cpu_or_memory_per_gpu_no_server_offers_is_refused(alice: Any, token_client: Any) -> None:
    """A100 servers: 32 cores and 256 GiB for 2 GPUs (16 cores, 128 GiB each); H100: twice."""
    _two_types()
    client = token_client(alice)
    cpus = _post(client, gpu_types=[A100], cpus_per_gpu=17)
    assert "16 cores" in str(_errors(cpus)["cpus_per_gpu"])
    memory = _post(client, mem_per_gpu_mib=300 * 1024)
    assert "no server offers that" in str(_errors(memory)["mem_per_gpu_mib"])
    ok = _post(client, gpu_types=[A100, H100], cpus_per_gpu=32, mem_per_gpu_mib=256 * 1024)
    assert ok.status_code == 201, ok.content
    assert ok.json()["cpus_per_gpu"] == 32


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"gpu_types": ["Not A Slug"]}, "gpu_types"),
        ({"gpu_types": "h100-80g"}, None),  # a comma list is accepted
        ({"node_selector": ["pool=train"]}, "node_selector"),
        ({"node_selector": {"pool": "bad value!"}}, "node_selector"),
        ({"cpus_per_gpu": -1}, "cpus_per_gpu"),
        ({"cpus_per_gpu": True}, "cpus_per_gpu"),
        ({"mem_per_gpu_mib": "16G"}, "mem_per_gpu_mib"),
    ],
)
def test_bad_request_values_are_a_400_naming_the_field(
    alice: Any, token_client: Any, fields: dict[str, Any], field: str | None
) -> None:
    _two_types()
    response = _post(token_client(alice), **fields)
    if field is None:
        assert response.status_code == 201, response.content
        assert response.json()["gpu_types"] == [H100]
        return
    assert field in _errors(response)
    assert Job.objects.count() == 0


def test_tenant_defaults_fill_cpu_and_memory(alice: Any, acme: Any) -> None:
    _two_types()
    acme.default_cpus_per_gpu, acme.default_mem_per_gpu_mib = 8, 4096
    acme.save()
    job = _submit(alice, acme)
    assert (job.cpus_per_gpu, job.mem_per_gpu_mib) == (8, 4096)


@pytest.mark.parametrize("policy", ["fifo", "elastic-tiresias"])
def test_a_job_asking_for_type_b_never_lands_on_type_a(alice: Any, acme: Any, policy: str) -> None:
    """Elastic jobs asking for H100s grow only over H100s, tick after tick, while the A100s
    stay idle; a job of any type takes the A100s."""
    _two_types()
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    first = _submit(alice, acme, gpus=1, min_gpus=1, max_gpus=4, gpu_types=[H100])
    second = _submit(alice, acme, gpus=1, min_gpus=1, max_gpus=4, gpu_types=[H100])
    for _ in range(4):
        run_tick(policy=policy)
        for job in (first, second):
            job.refresh_from_db()
            assert _types_of(job) <= {H100}, (job.pk, _types_of(job))
    assert first.state == "running" and _types_of(first) == {H100}
    # Elastic-Tiresias scales out over the idle H100s, never over the four idle A100s;
    # FIFO starts each at its request.
    held = sum(j.parallelism for j in (first, second) if j.state == "running")
    assert held == (4 if policy == "elastic-tiresias" else 2)
    anywhere = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2)
    for _ in range(2):
        run_tick(policy=policy)
    anywhere.refresh_from_db()
    assert anywhere.state == "running" and _types_of(anywhere) == {A100}


def test_a_selector_keeps_a_job_on_its_pool(alice: Any, acme: Any) -> None:
    _two_types()
    acme.profile_jobs = False
    acme.save()
    job = _submit(
        alice, acme, gpus=2, min_gpus=2, max_gpus=2, node_selector={"pool": "interactive"}
    )
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running"
    held = Server.objects.filter(gpu_set__assignment__job=job).values_list("labels", flat=True)
    assert held and all(labels["pool"] == "interactive" for labels in held)


def test_a_type_a_quota_holds_on_the_live_tick(alice: Any, acme: Any) -> None:
    """acme may hold 2 A100s: its second A100 job waits, named by the quota, while an H100
    job of the same tenant starts."""
    _two_types()
    acme.gpu_quota, acme.profile_jobs, acme.gpu_type_quota = 16, False, {A100: 2}
    acme.save()
    first = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[A100])
    run_tick(policy="fifo")
    second = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[A100])
    other = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[H100])
    for _ in range(3):
        run_tick(policy="fifo")
    for job in (first, second, other):
        job.refresh_from_db()
    assert first.state == "running" and other.state == "running"
    assert second.state == "queued"
    assert A100 in second.wait_reason and "quota" in second.wait_reason


def test_a_request_above_every_accepted_type_quota_is_refused(
    alice: Any, token_client: Any, acme: Any
) -> None:
    _two_types()
    acme.gpu_type_quota = {A100: 1}
    acme.save()
    response = _post(token_client(alice), gpus=2, gpu_types=[A100])
    assert "gpus" in _errors(response)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the kept state is PostgreSQL's")
def test_the_kept_state_sees_types_labels_and_type_quotas_as_a_rebuild_does(
    alice: Any, acme: Any, settings: Any
) -> None:
    """Every tick compared with a full rebuild: typed jobs, a per-type quota, a server's
    labels changed under the kept state; never a mismatch, and the relabelled pool is used."""
    settings.TICK_INCREMENTAL, settings.TICK_VERIFY_EVERY = True, 1
    incremental.forget()
    _two_types()
    acme.gpu_quota, acme.profile_jobs, acme.gpu_type_quota = 16, False, {H100: 2}
    acme.save()
    jobs = [
        _submit(alice, acme, gpus=1, min_gpus=1, max_gpus=2, gpu_types=[H100]),
        _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[H100]),
        _submit(alice, acme, gpus=1, min_gpus=1, max_gpus=4, gpu_types=[A100]),
    ]
    for _ in range(3):
        run_tick(policy="elastic-tiresias")
    Server.objects.filter(node="a100-0").update(labels={"pool": "special"})
    special = _submit(
        alice, acme, gpus=1, min_gpus=1, max_gpus=1, node_selector={"pool": "special"}
    )
    for _ in range(3):
        run_tick(policy="elastic-tiresias")
    state = incremental.kept_state()
    assert state.verifications >= 5 and state.mismatches == 0
    for job in (*jobs, special):
        job.refresh_from_db()
    assert jobs[1].state == "queued" and "quota" in jobs[1].wait_reason
    assert _types_of(jobs[0]) == {H100} and _types_of(jobs[2]) <= {A100}
    incremental.forget()


def test_the_forecast_waits_for_the_type_a_job_asks_for(alice: Any, acme: Any) -> None:
    """Four H100s busy, four A100s idle: a queued H100 job is forecast to start when the
    running one ends, not now on the idle A100s; a job of any type starts now."""
    _two_types()
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    running = _submit(alice, acme, gpus=4, min_gpus=4, max_gpus=4, gpu_types=[H100])
    run_tick(policy="fifo")
    running.refresh_from_db()
    assert running.state == "running"
    typed = _submit(alice, acme, gpus=4, min_gpus=4, max_gpus=4, gpu_types=[H100])
    anywhere = _submit(alice, acme, gpus=4, min_gpus=4, max_gpus=4)
    Job.objects.filter(pk__in=[typed.pk, anywhere.pk]).update(state="queued")
    live = compute_forecast(timezone.now())
    assert live is not None
    estimates = {live.ids[name]: estimate for name, estimate in live.result.estimates.items()}
    assert estimates[anywhere.pk].start == 0
    assert estimates[typed.pk].start is None or estimates[typed.pk].start > 0


def test_portalctl_submit_asks_for_a_type_a_selector_cpus_and_memory(
    env: dict[str, str],  # noqa: F811 (the fixture)
    acme: Any,
) -> None:
    """The flags reach the real API; a selector nothing matches is refused with the reason."""
    _two_types()
    result = run(env, "submit", "--workload", "mlp-digits", "--gpus", "2",
                 "--gpu-type", f"{H100},{A100}", "--selector", "pool=train",
                 "--cpus", "8", "--mem", "16G")  # fmt: skip
    assert result.exit_code == 0, result.output
    job = Job.objects.get(pk=int(result.output.strip()))
    assert job.gpu_types == [H100, A100] and job.node_selector == {"pool": "train"}
    assert (job.cpus_per_gpu, job.mem_per_gpu_mib) == (8, 16 * 1024)
    refused = run(env, "submit", "--workload", "mlp-digits", "--gpus", "2",
                  "--selector", "pool=nowhere")  # fmt: skip
    assert refused.exit_code != 0
    assert "pool=nowhere" in refused.output
    bad = run(env, "submit", "--workload", "mlp-digits", "--gpus", "2", "--mem", "lots")
    assert bad.exit_code == 2 and "bad memory size" in bad.output
    assert Job.objects.count() == 1


def test_the_submit_form_asks_for_types_and_labels_and_says_why_it_refuses(alice: Any) -> None:
    _two_types()
    page = Client()
    page.force_login(alice)
    base = {"tenant": "acme", "name": "train", "source": "builtin", "workload": "mlp-digits",
            "gpus": "2", "priority": "50", "recovery": "consistent",
            "checkpoint_interval": "50"}  # fmt: skip
    refused = page.post("/jobs/new/", {**base, "node_selector": "pool=nowhere"})
    assert refused.status_code == 200
    assert "pool=nowhere" in refused.content.decode() and not Job.objects.exists()
    unreadable = page.post("/jobs/new/", {**base, "node_selector": "pool"})
    assert "must be label=value" in unreadable.content.decode()
    page.post("/jobs/new/", {**base, "gpu_types": f"{H100}", "node_selector": "pool=train",
                             "cpus_per_gpu": "4", "mem_per_gpu_mib": "1024"})  # fmt: skip
    job = Job.objects.get()
    assert (job.gpu_types, job.node_selector) == ([H100], {"pool": "train"})
    assert (job.cpus_per_gpu, job.mem_per_gpu_mib) == (4, 1024)


def test_usage_and_fair_share_count_gpu_hours_by_type_with_its_weight(
    alice: Any, acme: Any, settings: Any
) -> None:
    """An H100 hour counts 2 (GPU_TYPE_WEIGHTS): the usage report lists hours per type and
    their weighted figure; fair share's usage is the weighted sum."""
    settings.GPU_TYPE_WEIGHTS = f"{H100}:2"
    _two_types()
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    on_h100 = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[H100])
    on_a100 = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[A100])
    run_tick(policy="fifo")
    for job in (on_h100, on_a100):
        job.refresh_from_db()
    assert (on_h100.ran_on_type, on_a100.ran_on_type) == (H100, A100)
    later = timezone.now() + timedelta(hours=1)
    report = usage_report(Job.objects.all(), since=later - timedelta(days=1), until=later,
                          now=later, group_by="tenant")  # fmt: skip
    rows = {row["gpu_type"]: row for row in report["by_type"]}
    assert rows[H100]["gpu_hours"] == pytest.approx(2.0, abs=0.01)
    assert rows[H100]["weighted_gpu_hours"] == pytest.approx(4.0, abs=0.02)
    assert rows[A100]["weighted_gpu_hours"] == pytest.approx(rows[A100]["gpu_hours"])
    usage = decayed_usage_by_tenant(later, half_life_s=1e7)
    assert usage["acme"] == pytest.approx((2 * 2 + 2 * 1) * 3600, rel=0.01)


def test_demo_cluster_two_type_loads_two_types_and_the_default_is_unchanged(
    settings: Any,
) -> None:
    settings.DEMO_CLUSTER = "two-type"
    ensure_demo_fabric()
    assert set(Server.objects.values_list("gpu_type", flat=True)) == {A100, H100}
    assert {labels["pool"] for labels in Server.objects.values_list("labels", flat=True)} == {
        "train",
        "interactive",
    }
    assert demo_fabric("uniform") == DEMO_FABRIC
    with pytest.raises(ValueError, match="DEMO_CLUSTER='big': choose one of uniform, two-type"):
        demo_fabric("big")


def test_a_draining_servers_job_moves_within_its_type(alice: Any, acme: Any) -> None:
    """Its H100 server drains while an A100 server beside it on its leaf is idle: the job
    moves to the H100 server of the other leaf."""
    mixed_leaves = {**DEMO_FABRIC, "servers": [
        {"leaf": 0, "slot": 0, "node": "a-0", "gpu_type": A100},
        {"leaf": 0, "slot": 1, "node": "h-0", "gpu_type": H100},
        {"leaf": 1, "slot": 0, "node": "h-1", "gpu_type": H100},
        {"leaf": 1, "slot": 1, "node": "a-1", "gpu_type": A100},
    ]}  # fmt: skip
    demo_cluster(mixed_leaves)  # type: ignore[arg-type]
    acme.profile_jobs = False
    acme.save()
    job = _submit(alice, acme, gpus=1, min_gpus=1, max_gpus=1, gpu_types=[H100])
    run_tick(policy="fifo")
    held = Server.objects.filter(gpu_set__assignment__job=job).get()
    do_set_server_state(node=held.node, state="draining")
    run_tick(policy="fifo")
    job.refresh_from_db()
    moved = set(Server.objects.filter(gpu_set__assignment__job=job).values_list("node", flat=True))
    assert moved and held.node not in moved
    assert _types_of(job) == {H100}
