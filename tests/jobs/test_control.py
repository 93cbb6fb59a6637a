"""The control plane against the real database and Redis: ticks, binding, reports, faults."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from django.db import transaction

from control.reports import handle_report
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_set_server_state
from jobs.agent_trust import key_of
from jobs.models import Job, JobCable, JobGpu
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from portal.celery import app
from tests.jobs.control_helpers import demo_cluster, drain_all
from workers.elastic.keys import JobKeys
from workers.protocol import agent_queue
from workers.signing import seal

pytestmark = pytest.mark.django_db(transaction=True)


def submit(
    user: Any, tenant: Any, gpus: int = 2, lo: int | None = None, hi: int | None = None
) -> Job:
    data = {
        "name": f"j{gpus}",
        "workload": "mlp-digits",
        "gpus": gpus,
        "min_gpus": lo or gpus,
        "max_gpus": hi or gpus,
    }
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def held(job: Job) -> list[int]:
    return list(
        JobGpu.objects.filter(job=job).order_by("rank").values_list("gpu__index", flat=True)
    )


def test_commands_left_in_the_queues_by_an_earlier_run_are_discarded() -> None:
    """The shared Redis keeps what an earlier run left; signed long ago, it must not fail a test."""
    nodes = demo_cluster()
    stale = seal({"type": "stop"}, node=nodes[0], key=key_of(nodes[0]), now=time.time() - 3600)
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(agent_queue(nodes[0]))
        queue.put([[stale], {}, {}])
        queue.close()
    assert demo_cluster() == nodes
    assert drain_all(nodes) == {n: [] for n in nodes}


def test_tick_starts_jobs_on_vclos_and_sends_commands(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    drain_all(nodes)
    small = submit(alice, acme, gpus=2)
    big = submit(alice, acme, gpus=4)
    result = run_tick(policy="fifo")
    assert result.ran
    small.refresh_from_db()
    big.refresh_from_db()
    assert (small.state, small.parallelism) == ("running", 2)
    assert (big.state, big.parallelism) == ("running", 4)
    assert not set(held(small)) & set(held(big))
    # 2 GPUs and 4 GPUs fit under single leaves (4 GPUs per leaf): no cables needed.
    assert {Server.objects.get(gpu_set__index=g).leaf for g in held(big)} == {
        Server.objects.get(gpu_set__index=held(big)[0]).leaf
    }
    sent = drain_all(nodes)
    starts = [c for cmds in sent.values() for c in cmds if c["type"] == "start_workers"]
    assert sum(len(c["workers"]) for c in starts) == 6
    assert {c["job"] for c in starts} == {f"job-{small.pk}", f"job-{big.pk}"}
    assert all(c["initial_world"] in (2, 4) and not c["join"] for c in starts)
    # A second tick changes nothing: ticks are idempotent.
    assert run_tick(policy="fifo").changed_jobs == ()
    assert drain_all(nodes) == {n: [] for n in nodes}


def test_cross_leaf_job_reserves_cables_and_cancel_releases(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, gpus=8)  # the whole demo fabric: 2 leaves x 4
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running" and len(held(job)) == 8
    assert JobCable.objects.filter(job=job).count() == 8  # m * n = 2 x 4 cables
    assert job.allocation["leaves"] == [0, 1]
    drain_all(nodes)
    do_cancel_job(user=alice, job_id=job.pk)
    assert JobGpu.objects.count() == 0 and JobCable.objects.count() == 0
    stops = [c for cmds in drain_all(nodes).values() for c in cmds]
    assert {c["type"] for c in stops} == {"stop_job"} and len(stops) == 4


def test_elastic_scale_out_then_in_when_others_arrive(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False  # profiling has its own test
    acme.save()
    first = submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy="elastic-tiresias")
    first.refresh_from_db()
    # Idle GPUs and no measurement yet (optimistic prior): it starts at its maximum.
    assert (first.state, first.parallelism, len(held(first))) == ("running", 4, 4)
    drain_all(nodes)
    others = [submit(alice, acme, gpus=2, lo=1, hi=2) for _ in range(3)]
    run_tick(policy="elastic-tiresias")
    first.refresh_from_db()
    states = [Job.objects.get(pk=o.pk).state for o in others]
    assert states == ["running"] * 3, states
    # Its extra GPUs were reclaimed first: a stop-free scale-in, back to its request.
    assert first.state == "scaling" and len(held(first)) == 2
    assert JobGpu.objects.count() == 8
    commands = [c for cmds in drain_all(nodes).values() for c in cmds]
    scale_in = [c for c in commands if c["type"] == "scale_in"]
    assert len(scale_in) == 1 and len(scale_in[0]["worker_ids"]) == 2
    assert "scale in 4→2" in " ".join(first.events.values_list("reason", flat=True))


def test_reports_progress_finish_and_replays(alice: Any, acme: Any) -> None:
    demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    name = f"job-{job.pk}"
    progress = {
        "type": "progress",
        "node": "node-0",
        "job": name,
        "event_id": "1700000000000-0",
        "step": 10,
        "samples_per_s": 123.0,
        "world": 2,
        "loss": 1.5,
    }
    assert handle_report(progress) == "progress"
    assert handle_report(progress) == "duplicate"  # replayed: no change
    job.refresh_from_db()
    assert (job.step, job.samples_per_s, job.metrics.count()) == (10, 123.0, 1)
    finished = {
        "type": "finished",
        "node": "node-0",
        "job": name,
        "event_id": "1700000000001-0",
        "step": 50,
    }
    assert handle_report(finished) == "completed"
    assert handle_report(finished) == "duplicate"
    job.refresh_from_db()
    assert job.state == "completed" and job.finished_at is not None
    assert job.step == 50  # progress ends at the final step, not the last progress report's
    assert JobGpu.objects.filter(job=job).count() == 0
    assert handle_report({"type": "progress", "node": "x"}).startswith("invalid")
    assert handle_report({"type": "teleport", "node": "x"}).startswith("invalid")
    assert handle_report({**progress, "job": "job-999999", "event_id": "2-0"}) == "unknown job"


def test_an_event_that_arrives_after_a_newer_one_still_counts_once(alice: Any, acme: Any) -> None:
    """Agents on several nodes forward a job's events: their reports can cross."""
    demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    name = f"job-{job.pk}"
    newer = {"type": "progress", "node": "node-1", "job": name, "event_id": "1700000000005-0",
             "step": 30, "samples_per_s": 99.0, "world": 2}  # fmt: skip
    older = {"type": "finished", "node": "node-0", "job": name, "event_id": "1700000000004-0",
             "step": 30}  # fmt: skip
    assert handle_report(newer) == "progress"
    assert handle_report({**newer, "event_id": "1700000000003-0"}) == "duplicate"  # stale
    assert handle_report(older) == "completed"
    assert handle_report(older) == "duplicate"
    job.refresh_from_db()
    assert job.state == "completed" and job.last_event_id == "1700000000005-0"


def test_server_down_requeues_or_shrinks(
    alice: Any, acme: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    nodes = demo_cluster()
    whole = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    node = Server.objects.get(gpu_set__index=held(whole)[0]).node
    drain_all(nodes)
    do_set_server_state(node=node, state="down")
    client = redis.Redis.from_url(settings.REDIS_URL)
    stale = JobKeys(f"job-{whole.pk}").prefix + "leader"
    client.set(stale, "a worker that died with its server")
    with django_capture_on_commit_callbacks(execute=True):
        run_tick(policy="fifo")
    # The dead run's coordination keys went, so the next first generation starts afresh.
    assert not client.exists(stale)
    whole.refresh_from_db()
    # Its only server went down; the job was requeued and placed again elsewhere.
    assert whole.state == "running"
    assert node not in {Server.objects.get(gpu_set__index=g).node for g in held(whole)}
    assert "went down" in " ".join(whole.events.values_list("reason", flat=True))


def test_drain_migrates_running_jobs_off_the_server(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    node = Server.objects.get(gpu_set__index=held(job)[0]).node
    drain_all(nodes)
    do_set_server_state(node=node, state="draining")
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "scaling"
    assert node not in {Server.objects.get(gpu_set__index=g).node for g in held(job)}
    commands = [c for cmds in drain_all(nodes).values() for c in cmds]
    assert [c["type"] for c in commands] == ["migrate"]
    assert len(commands[0]["leaving"]) == 2 and len(commands[0]["joining"]["workers"]) == 2
    done = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "5-0",
        "world": 2,
        "step": 40,
        "generation": 1,
        "pause_s": 0.05,
    }
    assert handle_report(done) == "scaled"
    job.refresh_from_db()
    assert job.state == "running"


def test_a_tick_that_dies_midway_leaves_nothing_behind(
    alice: Any, acme: Any, monkeypatch: Any
) -> None:
    demo_cluster()
    job = submit(alice, acme, gpus=2)
    from control import tick

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("worker killed mid-tick")

    monkeypatch.setattr(tick, "apply_bound", explode)
    with pytest.raises(RuntimeError):
        run_tick(policy="fifo")
    assert JobGpu.objects.count() == 0
    assert Job.objects.get(pk=job.pk).state == "queued"
    monkeypatch.undo()
    assert run_tick(policy="fifo").ran  # the lock was released; the next tick repairs
    assert Job.objects.get(pk=job.pk).state == "running"


def test_ticks_never_overlap(alice: Any, acme: Any) -> None:
    import redis
    from django.conf import settings

    demo_cluster()
    lock = redis.Redis.from_url(settings.REDIS_URL).lock("portal:scheduler-tick", timeout=5)
    assert lock.acquire(blocking=False)
    try:
        assert run_tick(policy="fifo").ran is False
    finally:
        lock.release()
    with transaction.atomic():
        pass


def test_a_tick_releases_its_lock_and_records_its_time_in_one_round_trip(
    monkeypatch: Any,
) -> None:
    from django.conf import settings

    from control.tick_stats import TICK_STATS_KEY

    demo_cluster()
    client = redis.Redis.from_url(settings.REDIS_URL)
    before = int(client.hget(TICK_STATS_KEY, "count") or 0)
    sent: list[list[Any]] = []
    execute = redis.client.Pipeline.execute

    def spy(self: Any, raise_on_error: bool = True) -> Any:
        sent.append([args[0] for args, _ in self.command_stack])
        return execute(self, raise_on_error)

    monkeypatch.setattr(redis.client.Pipeline, "execute", spy)
    result = run_tick(policy="fifo")
    assert result.ran and result.duration_s > 0
    assert ["EVAL", "HINCRBY", "HINCRBYFLOAT", "HSET"] in sent  # one round trip
    assert not client.exists("portal:scheduler-tick")
    assert int(client.hget(TICK_STATS_KEY, "count") or 0) == before + 1
    assert float(client.hget(TICK_STATS_KEY, "last") or 0) > 0


def test_a_tick_that_outlived_its_lock_leaves_the_next_holder_s_lock_alone(
    monkeypatch: Any, caplog: Any
) -> None:
    from django.conf import settings

    import control.tick

    demo_cluster()
    client = redis.Redis.from_url(settings.REDIS_URL)
    tick = control.tick._tick

    def slow_tick(*args: Any) -> Any:
        client.set("portal:scheduler-tick", "another")  # expired; another tick took it
        return tick(*args)

    monkeypatch.setattr(control.tick, "_tick", slow_tick)
    try:
        assert run_tick(policy="fifo").ran
        assert client.get("portal:scheduler-tick") == b"another"
        assert "the tick outlived its lock" in caplog.text
    finally:
        client.delete("portal:scheduler-tick")


def test_profile_at_max_then_curve_drives_the_policy(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy="elastic-tiresias")  # starts it at its maximum (idle GPUs)
    run_tick(policy="elastic-tiresias")  # it runs at its maximum: profile it
    job.refresh_from_db()
    assert job.parallelism == 4 and job.profile_state == "requested"
    profile = [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == "profile"]
    assert len(profile) == 1
    assert (profile[0]["min_workers"], profile[0]["max_workers"]) == (1, 4)
    # The runtime scales in level by level; each switch comes back as scale_done.
    workers = [f"w{g}" for g in held(job)]
    name = f"job-{job.pk}"
    for i, world in enumerate((3, 2, 1)):
        report = {
            "type": "scale_done",
            "node": "node-0",
            "job": name,
            "event_id": f"{10 + i}-0",
            "world": world,
            "workers": workers[:world],
            "step": 20 * (i + 1),
        }
        assert handle_report(report) == "scaled"
        assert len(held(job)) == world
    # Throughput falls past 3 GPUs: the policy grows it back to 3, not 4.
    curve = [
        {"workers": n, "samples_per_s": v}
        for n, v in ((4, 190.0), (3, 205.0), (2, 200.0), (1, 110.0))
    ]
    done = {
        "type": "profile_done",
        "node": "node-0",
        "job": name,
        "event_id": "20-0",
        "curve": curve,
    }
    assert handle_report(done) == "profiled"
    job.refresh_from_db()
    assert job.profile_state == "done" and job.throughput_curve["2"] == 200.0
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert len(held(job)) == 3  # the gain from 3 to 4 GPUs is negative
    assert job.events.filter(kind="profiled").count() == 2


def test_unplaceable_sizes_are_refused_and_waiting_jobs_say_why(
    alice: Any, acme: Any, token_client: Any
) -> None:
    demo_cluster()
    client = token_client(alice)
    response = client.post(
        "/api/v1/jobs/", {"name": "six", "workload": "mlp-digits", "gpus": 6}, format="json"
    )
    assert response.status_code == 400
    assert "cannot form an isolated" in response.json()["errors"]["gpus"][0]
    acme.gpu_quota = 4
    acme.save()
    first = submit(alice, acme, gpus=4)
    second = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    second.refresh_from_db()
    assert Job.objects.get(pk=first.pk).state == "running"
    assert second.state == "queued" and "quota" in second.wait_reason
    run_tick(policy="fifo")  # an unchanged reason is not recorded twice
    assert second.events.filter(reason__startswith="waiting:").count() == 1


def test_cancel_during_scaling_releases_everything_and_late_reports_change_nothing(
    alice: Any, acme: Any
) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False
    acme.save()
    job = submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy="elastic-tiresias")
    others = [submit(alice, acme, gpus=2, lo=2, hi=2) for _ in range(3)]
    run_tick(policy="elastic-tiresias")  # reclaims job's extras: a scale-in switch
    job.refresh_from_db()
    assert job.state == "scaling"
    drain_all(nodes)
    do_cancel_job(user=alice, job_id=job.pk)
    job.refresh_from_db()
    assert job.state == "cancelled" and not held(job)
    stops = [c for cmds in drain_all(nodes).values() for c in cmds]
    assert stops and {c["type"] for c in stops} == {"stop_job"}
    late = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "9-0",
        "world": 2,
        "workers": ["w0", "w1"],
        "step": 5,
    }
    assert handle_report(late) == "noted"
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    assert all(Job.objects.get(pk=o.pk).state == "running" for o in others)


def test_silent_agent_is_marked_down_and_its_jobs_recover(alice: Any, acme: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from inventory.services import do_heartbeat

    nodes = demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    node = Server.objects.get(gpu_set__index=held(job)[0]).node
    # Every other agent keeps reporting; this one went silent a minute ago (its newest
    # heartbeat, arrived and sent, is that old: demo_cluster's of now is forgotten).
    Server.objects.filter(node=node).update(agent_info={})
    for other in nodes:
        at = timezone.now() - timedelta(seconds=60) if other == node else timezone.now()
        do_heartbeat(node=other, info={}, at=at)
    result = run_tick(policy="fifo")
    assert result.down_nodes == (node,)
    job.refresh_from_db()
    assert job.state == "running"  # requeued and placed again on live servers
    assert node not in {Server.objects.get(gpu_set__index=g).node for g in held(job)}
    do_heartbeat(node=node, info={})
    assert Server.objects.get(node=node).state == "up"  # back once it reports again


def test_an_elastic_start_whose_extras_fit_no_shape_starts_on_its_base(
    alice: Any, acme: Any
) -> None:
    """The 19:40 run at 138.8 s: 2 + 1 GPUs free on two leaves, j14 (2, up to 4) planned on 3."""
    demo_cluster()
    acme.profile_jobs = False  # profiling has its own test
    acme.save()
    two, three = submit(alice, acme, gpus=2), submit(alice, acme, gpus=3)
    run_tick(policy="fifo")
    leaves = {
        job.pk: {Server.objects.get(gpu_set__index=g).leaf for g in held(job)}
        for job in (two, three)
    }
    assert len(leaves[two.pk]) == len(leaves[three.pk]) == 1
    assert leaves[two.pk] != leaves[three.pk]  # 2 free on one leaf, 1 on the other
    (leaf,) = leaves[two.pk]
    elastic = submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy="elastic-tiresias")
    elastic.refresh_from_db()
    # Planned on 3 (an idle GPU as an extra): no 3-GPU shape, so it starts on its 2.
    assert (elastic.state, elastic.parallelism, elastic.wait_reason) == ("running", 2, "")
    assert {Server.objects.get(gpu_set__index=g).leaf for g in held(elastic)} == {leaf}
    assert JobCable.objects.filter(job=elastic).count() == 0
    placed = elastic.events.get(reason__startswith="placed on 2 GPUs")
    assert placed.reason.endswith("no vClos shape for the planned 3: it scales out later")


def test_a_reclaim_moves_the_shrunk_job_when_its_freed_gpu_alone_fits_no_shape(
    alice: Any, acme: Any
) -> None:
    """The 2026-12-04 04:21 run at 294.7 s: j17 held all of leaf 0, j10 (4 GPUs) waited."""
    demo_cluster()
    acme.profile_jobs = False  # profiling has its own test
    acme.gpu_quota = 16  # the reclaim makes room on the cluster, not in the quota
    acme.save()
    elastic = submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy="elastic-tiresias")  # it starts on 4: its 2 and two idle GPUs as extras
    assert len(held(elastic)) == 4
    one = submit(alice, acme, gpus=1)
    run_tick(policy="fifo")
    leaf_of = {g: Server.objects.get(gpu_set__index=g).leaf for g in range(8)}
    (full,) = {leaf_of[g] for g in held(elastic)}
    assert {leaf_of[g] for g in held(one)} == {1 - full}  # 3 GPUs free, on the other leaf
    rigid = submit(alice, acme, gpus=4)
    run_tick(policy="elastic-tiresias")
    elastic.refresh_from_db()
    rigid.refresh_from_db()
    # Kept in place, the shrink 4→3 would leave 1 + 3 free GPUs: no shape for 4.  Asked
    # first, the allocator gives the rigid job the whole leaf, and the elastic one moves.
    assert (rigid.state, len(held(rigid))) == ("running", 4), rigid.wait_reason
    assert {leaf_of[g] for g in held(rigid)} == {full}
    assert len(held(elastic)) == 3 and {leaf_of[g] for g in held(elastic)} == {1 - full}
    assert elastic.events.filter(reason__startswith="scale in 4→3").exists()


def test_a_job_that_finishes_mid_switch_stops_the_newcomers_it_started(
    alice: Any, acme: Any
) -> None:
    """The 2026-12-04 12:01 live run: a job finished 6 s into a scale-out; its newcomers
    kept their slots for minutes and the next job's start there was rejected three times."""
    nodes = demo_cluster()
    acme.profile_jobs = False
    acme.save()
    submit(alice, acme, gpus=4)  # one leaf
    filler = submit(alice, acme, gpus=2)
    job = submit(alice, acme, gpus=2, lo=2, hi=4)
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert (job.state, job.parallelism) == ("running", 2)
    do_cancel_job(user=alice, job_id=filler.pk)  # its node's GPUs: the job grows onto them
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert job.state == "scaling"
    switch = job.events.filter(data__has_key="from").latest("id").data
    node_of = {g: Server.objects.get(gpu_set__index=g).node for g in switch["from"] + switch["to"]}
    members = {node_of[g] for g in switch["from"]}
    newcomers_only = {node_of[g] for g in switch["to"]} - members
    assert newcomers_only, switch
    drain_all(nodes)
    finished = {"type": "finished", "node": sorted(members)[0], "job": f"job-{job.pk}",
                "event_id": "1700000000001-0", "step": 50}  # fmt: skip
    assert handle_report(finished) == "completed"
    sent = drain_all(nodes)
    stopped = {node for node, cmds in sent.items() for c in cmds if c["type"] == "stop_job"}
    assert stopped == newcomers_only  # a member's node is left to finish its last writes
    assert JobGpu.objects.filter(job=job).count() == 0


def test_a_job_that_finishes_outside_a_switch_stops_nothing(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    drain_all(nodes)
    finished = {"type": "finished", "node": "node-0", "job": f"job-{job.pk}",
                "event_id": "1700000000001-0", "step": 5}  # fmt: skip
    assert handle_report(finished) == "completed"
    assert drain_all(nodes) == {n: [] for n in nodes}
