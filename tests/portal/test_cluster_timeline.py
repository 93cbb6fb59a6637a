"""The cluster view's timeline: a replay kept between requests equals one made from scratch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat, do_load_topology
from jobs.lifecycle import transition
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal import cluster_timeline
from portal.cluster_timeline import Replay, full_replay, timeline
from tenancy.models import Tenant

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_sums_follow_each_jobs_share() -> None:
    replay = Replay(curves={2: {"1": 100.0, "2": 150.0}})
    assert replay.apply(
        [
            (1, 1, at(0), "queued", None),
            (2, 2, at(1), "queued", None),
            (3, 1, at(2), "running", 4),  # no curve: counts as scaling perfectly
            (4, 2, at(3), "running", 2),
            (5, 1, at(4), "", 2),  # scaled in
            (6, 2, at(5), "completed", 0),
        ]
    )
    assert [p[1:] for p in replay.points] == [
        (1, 0, 0.0),
        (2, 0, 0.0),
        (1, 4, 4.0),
        (0, 6, 5.5),
        (0, 4, 3.5),
        (0, 2, 2.0),
    ]
    series = replay.series(at(2.5), at(10), total_gpus=8)
    assert series["t"][0] == at(2.5).isoformat() and series["t"][-1] == at(10).isoformat()
    assert series["queue"] == [1, 0, 0, 0, 0] and series["gpus_in_use"] == [4, 6, 4, 2, 2]
    assert series["efficiency"] == [0.5, 0.6875, 0.4375, 0.25, 0.25]


def test_an_event_that_belongs_before_what_was_applied_asks_for_a_replay() -> None:
    replay = Replay()
    assert replay.apply([(1, 1, at(10), "queued", None)])
    assert replay.apply([(1, 1, at(10), "queued", None)])  # re-read, not applied twice
    assert len(replay.points) == 1
    assert not replay.apply([(2, 1, at(9), "running", 1)])


def test_a_replay_whose_newest_event_is_gone_is_not_extended(db: None) -> None:
    replay = Replay()
    replay.apply([(10**12, 1, at(0), "queued", None)])
    assert not cluster_timeline.extend(replay)


@pytest.mark.django_db
def test_a_kept_replay_extended_by_new_events_equals_a_fresh_one(
    make_tenant: Callable[..., Tenant],
) -> None:
    do_load_topology({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})
    acme = make_tenant("acme", quota=16)
    owner = acme.memberships.get().user

    def submit(n: int) -> None:
        for i in range(n):
            data = {"name": f"j{i}", "workload": "mlp-digits", "gpus": 2, "max_gpus": 4}
            do_submit_job(user=owner, tenant=acme, spec=check_job_spec(tenant=acme, data=data))

    def tick() -> None:
        for node in Server.objects.values_list("node", flat=True):
            do_heartbeat(node=node, info={})
        run_tick(policy="elastic-tiresias")

    since = timezone.now() - timedelta(hours=1)
    submit(3)
    tick()
    first = timeline("1h", since, timezone.now(), 8)
    assert first["gpus_in_use"][-1] == 8
    kept = cluster_timeline._kept["1h"]

    running = Job.objects.filter(state="running").order_by("pk").first()
    assert running is not None
    transition(running, "cancelled", reason="test", at=timezone.now())
    submit(2)
    tick()
    now = timezone.now()
    extended = timeline("1h", since, now, 8)
    assert cluster_timeline._kept["1h"] is kept  # extended, not replayed again
    assert extended == full_replay(since).series(since, now, 8)
    assert extended["queue"][-1] == Job.objects.filter(state="queued").count()
    in_use = sum(Job.objects.filter(state="running").values_list("parallelism", flat=True))
    assert extended["gpus_in_use"][-1] == in_use
