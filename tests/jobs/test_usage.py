"""Usage accounting end to end: jobs resized by the real tick and reports, then every output.

The scenario (the clock is Django's ``timezone.now``, moved by the test)::

    T0 = 2026-03-01 23:00 UTC; the demo fabric has 8 GPUs
    T0        A (acme, alice, 1..4 GPUs) starts alone at 4
    T0+600    B (acme, carol), C and D (globex, bob), 2 GPUs each, start;
              A is asked to scale in to 2 (it holds 4 until its switch is done)
    T0+660    A's scale-in is done: 2 GPUs
    T0+800    B's runtime reports a recovery at 1 worker that the control plane does not apply
    T0+4200   C finishes (a report)             midnight UTC falls at T0+3600
    T0+7200   D is cancelled
    T0+9000   now: A and B still run at 2

    A: 4*660 + 2*8340 = 19320   B: 2*8400 = 16800   C: 2*3600 = 7200   D: 2*6600 = 13200
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from control.reports import handle_report
from control.tick import run_tick
from devtools.job_steps import move
from inventory.models import Server
from inventory.services import do_heartbeat
from jobs.lifecycle import record
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_cancel_job, do_set_parallelism, do_submit_job
from jobs.usage import decayed_usage_by_tenant, gpu_seconds_by_tenant
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
HELD = {"A": 19320.0, "B": 16800.0, "C": 7200.0, "D": 13200.0}
MARCH_1 = {"A": 4 * 600 + 4 * 60 + 2 * 2940, "B": 6000.0, "C": 6000.0, "D": 6000.0}


class Clock:
    """Django's ``timezone.now`` for every caller, moved by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        # The agents stay alive and list the jobs' processes (so the reconciler leaves them be).
        active = Job.objects.filter(state__in=("running", "scaling")).values_list("pk", flat=True)
        workers = [{"job": f"job-{pk}"} for pk in active]
        for node in Server.objects.values_list("node", flat=True):
            do_heartbeat(node=node, info={"slots": 2, "workers": workers}, at=self.now)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock(T0)
    monkeypatch.setattr(timezone, "now", clock)
    return clock


def submit(user: Any, tenant: Any, name: str, gpus: int, lo: int, hi: int) -> Job:
    data = {"name": name, "workload": "mlp-digits", "gpus": gpus, "min_gpus": lo, "max_gpus": hi}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def report(job: Job, kind: str, at: datetime, **fields: Any) -> str:
    stamp = at.timestamp()
    body = {"type": kind, "node": "node-0", "job": f"job-{job.pk}", "at": stamp}
    return handle_report({**body, "event_id": f"{int(stamp * 1000)}-0", **fields})


def run_scenario(clock: Clock, make_user: Callable[..., Any], acme: Any, globex: Any) -> dict:
    alice, bob = make_user("alice", acme), make_user("bob", globex)
    carol = make_user("carol", acme)
    demo_cluster()
    for tenant in (acme, globex):
        tenant.profile_jobs = False  # profiling resizes on its own; not this test's subject
        tenant.save()
    jobs = {"A": submit(alice, acme, "A", 2, 1, 4)}
    run_tick(policy="elastic-tiresias", now=clock.at(0))
    clock.at(300)  # a heartbeat between the ticks
    clock.at(600)
    jobs["B"] = submit(carol, acme, "B", 2, 1, 2)
    jobs["C"] = submit(bob, globex, "C", 2, 1, 2)
    jobs["D"] = submit(bob, globex, "D", 2, 1, 2)
    run_tick(policy="elastic-tiresias", now=clock.now)
    state = {k: Job.objects.get(pk=j.pk) for k, j in jobs.items()}
    assert (state["A"].state, state["A"].parallelism) == ("scaling", 4)
    assert [state[k].parallelism for k in "BCD"] == [2, 2, 2]
    kept = [slot.worker_id for slot in JobGpu.objects.filter(job=jobs["A"]).select_related("gpu")]
    assert len(kept) == 2
    assert report(jobs["A"], "scale_done", clock.at(660), world=2, workers=kept) == "scaled"
    # A runtime claim the control plane does not apply (no worker named dead): B keeps 2.
    assert report(jobs["B"], "recovered", clock.at(800), mode="approximate", world=1) == "recovered"
    for second in range(900, 4200, 300):
        run_tick(policy="elastic-tiresias", now=clock.at(second))  # nothing moves meanwhile
    assert report(jobs["C"], "finished", clock.at(4200), step=100) == "completed"
    clock.at(7200)
    do_cancel_job(user=bob, job_id=jobs["D"].pk)
    clock.at(9000)
    return jobs


@override_settings(METRICS_TOKEN="scrape-secret")
def test_held_gpu_seconds_reconcile_everywhere(
    clock: Clock, make_user: Callable[..., Any], acme: Any, globex: Any
) -> None:
    jobs = run_scenario(clock, make_user, acme, globex)
    admin = Client()
    admin.force_login(make_user("root", staff=True))
    query = {"since": "2026-03-01", "until": "2026-03-03"}

    by_job = admin.get("/api/v1/usage/", {**query, "group_by": "job"}).json()
    held = {row["job_name"]: row["gpu_seconds"] for row in by_job["rows"]}
    assert held == HELD  # to the second
    assert {row["job"]: row["user"] for row in by_job["rows"]} == {
        jobs["A"].pk: "alice",
        jobs["B"].pk: "carol",
        jobs["C"].pk: "bob",
        jobs["D"].pk: "bob",
    }
    tenants = admin.get("/api/v1/usage/", {**query, "group_by": "tenant"}).json()
    expected_tenants = {"acme": HELD["A"] + HELD["B"], "globex": HELD["C"] + HELD["D"]}
    assert {r["tenant"]: r["gpu_seconds"] for r in tenants["rows"]} == expected_tenants
    days = admin.get("/api/v1/usage/", {**query, "group_by": "day"}).json()
    assert {r["day"]: r["gpu_seconds"] for r in days["rows"]} == {
        "2026-03-01": sum(MARCH_1.values()),
        "2026-03-02": sum(HELD.values()) - sum(MARCH_1.values()),
    }
    users = admin.get("/api/v1/usage/", {**query, "group_by": "user"}).json()
    assert {r["user"]: r["gpu_seconds"] for r in users["rows"]} == {
        "alice": HELD["A"],
        "bob": HELD["C"] + HELD["D"],
        "carol": HELD["B"],
    }

    # CSV: the same rows, a header first.
    for group_by, report_json in (("job", by_job), ("day", days), ("tenant", tenants)):
        response = admin.get("/api/v1/usage/", {**query, "group_by": group_by, "format": "csv"})
        assert response["Content-Type"].startswith("text/csv")
        assert "attachment" in response["Content-Disposition"]
        parsed = list(csv.DictReader(io.StringIO(response.content.decode())))
        assert list(parsed[0]) == report_json["columns"]
        assert [float(r["gpu_seconds"]) for r in parsed] == [
            r["gpu_seconds"] for r in report_json["rows"]
        ]

    # The pages draw the same figures.
    page = admin.get("/usage/all/", {"since": "2026-03-01", "until": "2026-03-02"})
    data = page.context["data"]
    assert {r["tenant"]: r["gpu_seconds"] for r in data["by_tenant"]} == expected_tenants
    assert {r["day"]: r["gpu_seconds"] for r in data["by_day"]} == {
        r["day"]: r["gpu_seconds"] for r in days["rows"]
    }
    assert data["capacity_gpu_seconds"] == 8 * (clock.now - T0.replace(hour=0)).total_seconds()
    alice = Client()
    alice.force_login(jobs["A"].submitter)
    own = alice.get("/usage/", {"since": "2026-03-01", "until": "2026-03-02"}).context["data"]
    assert {r["user"]: r["gpu_seconds"] for r in own["by_user"]} == {
        "alice": HELD["A"],
        "carol": HELD["B"],
    }
    assert sum(r["gpu_seconds"] for r in own["by_day_user"]) == expected_tenants["acme"]

    # Prometheus: the all-time counter per tenant, and jobs by state per tenant.
    text = Client(headers={"Authorization": "Bearer scrape-secret"}).get("/metrics")
    lines = text.content.decode().splitlines()
    assert f'portal_gpu_seconds_total{{tenant="acme"}} {expected_tenants["acme"]}' in lines
    assert f'portal_gpu_seconds_total{{tenant="globex"}} {expected_tenants["globex"]}' in lines
    assert 'portal_tenant_jobs{state="running",tenant="acme"} 2.0' in lines
    assert 'portal_tenant_jobs{state="cancelled",tenant="globex"} 1.0' in lines
    assert gpu_seconds_by_tenant(now=clock.now) == expected_tenants

    # Fair share: a half-life far longer than the scenario counts plain seconds; a short one
    # weighs each second by its age, integrated exactly (A and B held 2 GPUs each since T0+660).
    long = decayed_usage_by_tenant(clock.now, half_life_s=1e9)
    assert long == pytest.approx(expected_tenants, rel=1e-5)
    short = decayed_usage_by_tenant(clock.now, half_life_s=60.0)
    rate = math.log(2) / 60.0
    # Only the last ten half-lives are read: the 600 s before now, at 4 GPUs.
    assert short["acme"] == pytest.approx(4 / rate * -math.expm1(-rate * 600), rel=1e-9)
    assert "globex" not in short  # D stopped 1800 s (30 half-lives) ago: not read at all


def test_members_see_their_tenant_only_and_bad_input_is_a_400(
    clock: Clock, make_user: Callable[..., Any], acme: Any, globex: Any
) -> None:
    jobs = run_scenario(clock, make_user, acme, globex)
    alice = Client()
    alice.force_login(jobs["A"].submitter)
    mine = alice.get("/api/v1/usage/", {"since": "2026-03-01", "group_by": "tenant"}).json()
    assert [r["tenant"] for r in mine["rows"]] == ["acme"]
    assert alice.get("/api/v1/usage/", {"tenant": "globex"}).status_code == 404
    assert alice.get("/api/v1/usage/", {"tenant": "nosuch"}).status_code == 404
    foreign = alice.get("/usage/", {"tenant": "globex"})
    assert foreign.status_code == 404 and "data" not in foreign.context
    assert alice.get("/usage/all/").status_code == 404  # admins only
    by_job = alice.get("/api/v1/usage/", {"since": "2026-03-01", "group_by": "job"}).json()
    assert {r["job_name"] for r in by_job["rows"]} == {"A", "B"}

    admin = Client()
    admin.force_login(make_user("root", staff=True))
    only = admin.get("/api/v1/usage/", {"since": "2026-03-01", "tenant": "globex"}).json()
    assert only["total"]["gpu_seconds"] == HELD["C"] + HELD["D"]

    bad = [
        ({"group_by": "planet"}, "group_by"),
        ({"since": "last week"}, "since"),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "since"),
        ({"since": "2024-01-01", "until": "2026-01-01"}, "until"),
        ({"format": "xml"}, "format"),
        ({"until": "2026-03-01\x00"}, "until"),
    ]
    for params, field in bad:
        response = alice.get("/api/v1/usage/", params)
        assert response.status_code == 400, params
        assert field in response.json()["errors"], response.json()
    assert alice.get("/usage/", {"since": "soon"}).status_code == 400
    assert alice.get("/usage/", {"since": "2025-01-01", "until": "2026-03-01"}).status_code == 400
    # Nothing was changed by any of it.
    assert Job.objects.filter(state="running").count() == 2
    assert Client().get("/api/v1/usage/").status_code in (401, 403)


def test_no_history_is_zero_and_a_user_without_tenant_sees_nothing(
    make_user: Callable[..., Any], acme: Any
) -> None:
    member = Client()
    member.force_login(make_user("dave", acme))
    empty = member.get("/api/v1/usage/", {"group_by": "tenant"}).json()
    assert empty["rows"] == [] and empty["total"]["gpu_seconds"] == 0
    csv_text = member.get("/api/v1/usage/", {"format": "csv"}).content.decode()
    assert csv_text == "day,gpu_seconds,gpu_hours\n"
    page = member.get("/usage/")
    assert page.status_code == 200 and page.context["data"]["by_day_user"] == []
    loner = Client()
    loner.force_login(make_user("erin"))
    assert loner.get("/usage/").status_code == 404
    assert loner.get("/api/v1/usage/", {"group_by": "tenant"}).json()["rows"] == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_read_the_same_by_intervals_and_by_aggregate(
    seed: int, clock: Clock, make_user: Callable[..., Any], acme: Any, globex: Any
) -> None:
    """Seeded random lives (start, resize, runtime claims, preemption, ends) through the services.

    The truth is what ``Job.parallelism`` was after each step, integrated here by hand;
    the row-by-row path (API) and the aggregate one (``/metrics``) must both match it.
    """
    rng = random.Random(seed)
    owners = {"acme": make_user("alice", acme), "globex": make_user("bob", globex)}
    tenants = {"acme": acme, "globex": globex}
    truth: dict[str, float] = defaultdict(float)
    lives: list[tuple[str, list[tuple[int, int]]]] = []  # tenant, (second, GPUs from then on)
    second = 0
    for index in range(8):
        slug = rng.choice(["acme", "globex"])
        job = submit(owners[slug], tenants[slug], f"r{index}", 1, 1, 4)
        steps: list[tuple[int, int]] = []
        for _ in range(rng.randint(1, 8)):
            second += rng.randint(1, 500)
            clock.now = T0 + timedelta(seconds=second)
            current = Job.objects.get(pk=job.pk)
            if current.state == "queued":
                move(job_id=job.pk, to_state="running", reason="r", parallelism=rng.randint(1, 4))
            elif rng.random() < 0.5:
                do_set_parallelism(job_id=job.pk, parallelism=rng.randint(1, 4), reason="r")
            elif rng.random() < 0.5:  # recorded as a runtime recovery report records it
                record(current, "recovered", clock.now, "claim",
                       from_parallelism=current.parallelism, to_parallelism=rng.randint(1, 4),
                       data={"step": 1, "generation": 0})  # fmt: skip
            else:
                move(job_id=job.pk, to_state="queued", reason="preempted")
            steps.append((second, Job.objects.get(pk=job.pk).parallelism))
        if rng.random() < 0.6:  # some end; the others still hold their GPUs at the end
            second += rng.randint(1, 500)
            clock.now = T0 + timedelta(seconds=second)
            move(job_id=job.pk, to_state=rng.choice(["completed", "cancelled"]), reason="end")
            steps.append((second, 0))
        lives.append((slug, steps))
    end = second + 1000
    clock.now = T0 + timedelta(seconds=end)
    for slug, steps in lives:
        for (start, gpus), (stop, _) in zip(steps, [*steps[1:], (end, 0)], strict=True):
            truth[slug] += gpus * (stop - start)

    admin = Client()
    admin.force_login(make_user("root", staff=True))
    api = admin.get("/api/v1/usage/", {"since": "2026-03-01", "group_by": "tenant"}).json()
    expected = {slug: seconds for slug, seconds in truth.items() if seconds}
    assert {r["tenant"]: r["gpu_seconds"] for r in api["rows"]} == expected
    assert {k: v for k, v in gpu_seconds_by_tenant(now=clock.now).items() if v} == expected
