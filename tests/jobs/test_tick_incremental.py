"""The incremental tick: its kept state equals a full rebuild, mismatches are caught, restarts rebuild.

Every check compares the state kept in the process (``control.incremental``)
with a full rebuild from the database (``control.state``, the reference),
and the policy's decisions and their bindings on both.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import generate_latest

from control import incremental
from control.assembly import KeptAside, set_aside
from control.incremental import FullRebuild, KeptState, Prepared, compare, rebuild
from control.policy import live_policy
from control.reports import handle_report
from control.state import read_servers
from control.tick import run_tick
from control.tick_stats import TICK_STATS_KEY
from inventory.models import Gpu, Server
from inventory.services import do_mark_gpu_suspect, do_set_server_state
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from portal.metrics import build_registry
from scheduler.binding import bind
from scheduler.placement import CountPlacement
from scheduler.types import Gpu as GpuView
from scheduler.types import GpuState
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = pytest.mark.django_db(transaction=True)
# The kept state reads PostgreSQL's row versions (xmin, ctid); on any other database the
# tick rebuilds in full (``source_for_tick``), which the tests marked so cannot exercise.
needs_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the kept state reads PostgreSQL's row versions"
)

FABRIC = {"leaves": 4, "spines": 4, "servers_per_leaf": 2, "gpus_per_server": 4}  # 32 GPUs
POLICY = "elastic-tiresias"


@pytest.fixture(autouse=True)
def fresh_process(settings: Any) -> Iterator[None]:
    """Each test starts as a new scheduler process would, ticking incrementally."""
    settings.TICK_INCREMENTAL = True
    settings.TICK_VERIFY_EVERY = 10_000  # only the tests' own comparisons, unless one says
    incremental.forget()
    yield
    incremental.forget()


def submit(user: Any, tenant: Any, gpus: int, lo: int, hi: int, priority: int = 50) -> Job:
    data = {
        "name": f"j{gpus}",
        "workload": "mlp-digits",
        "gpus": gpus,
        "min_gpus": lo,
        "max_gpus": hi,
        "priority": priority,
    }
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def kept_equals_rebuild() -> None:
    """The kept state, brought up to date, equals a full rebuild; so do decisions and bindings.

    Binding mutates the kept allocator as the tick's does, so the bound jobs are
    marked touched, as the tick marks them.
    """
    now = timezone.now()
    kept = incremental.kept_state()
    cluster = kept.cluster()
    assert cluster is not None
    mine = Prepared(cluster, kept.allocator(cluster), kept.policy_input(cluster, now))
    reference = rebuild(now, epoch=kept.epoch)  # the kept views' time base
    assert reference is not None
    assert compare(mine, reference) == []
    policy = live_policy(POLICY)
    decisions = policy.schedule(mine.view.snapshot, placement=CountPlacement())
    assert decisions == policy.schedule(reference.view.snapshot, placement=CountPlacement())
    # The policy core kept with the state (the tick's ``source.policy``) decides the same.
    assert kept.policy(POLICY).schedule(mine.view.snapshot, placement=CountPlacement()) == (
        decisions
    )
    bound, refused = bind(cluster.spec, mine.allocator, decisions)
    assert (bound, refused) == bind(reference.cluster.spec, reference.allocator, decisions)
    kept.touched(mine.view.ids[b.job] for b in bound)


def report(job: Job, kind: str, serial: int, **fields: Any) -> str:
    payload = {"type": kind, "node": "node-0", "job": f"job-{job.pk}", "event_id": f"{serial}-0"}
    return handle_report({**payload, **fields})


@needs_postgresql
def test_incremental_and_full_rebuild_agree_over_arrivals_endings_scaling_and_drains(
    alice: Any, acme: Any
) -> None:
    nodes = demo_cluster(FABRIC)
    acme.profile_jobs = False
    acme.save()
    jobs = [submit(alice, acme, gpus=2, lo=1, hi=8) for _ in range(3)]
    jobs.append(submit(alice, acme, gpus=4, lo=2, hi=8, priority=10))  # low class: ageing
    kept_equals_rebuild()  # the first read of a new process
    assert run_tick(policy=POLICY).ran
    kept_equals_rebuild()
    serial = 1_700_000_000_000
    # Progress (attained service, measured curve: no event, only the row changes).
    for job in Job.objects.filter(state="running"):
        serial += 1
        report(job, "progress", serial, step=5, samples_per_s=100.0, world=job.parallelism)
    kept_equals_rebuild()
    # Arrivals make the elastic jobs give GPUs back: scale-ins, then their reports.
    jobs += [submit(alice, acme, gpus=4, lo=4, hi=4) for _ in range(4)]
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    for job in Job.objects.filter(state="scaling"):
        serial += 1
        report(job, "scale_done", serial, world=len(JobGpu.objects.filter(job=job)), step=9)
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    # A completion and a cancellation.
    running = list(Job.objects.filter(state="running").order_by("pk"))
    serial += 1
    assert report(running[0], "finished", serial, step=50) == "completed"
    do_cancel_job(user=alice, job_id=running[1].pk)
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    # A drain: its jobs migrate; a server down: its jobs shrink or requeue.
    held = JobGpu.objects.select_related("gpu__server").first()
    assert held is not None
    do_set_server_state(node=held.gpu.server.node, state="draining")
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    other = Server.objects.exclude(state="draining").exclude(gpu_set__assignment=None).first()
    assert other is not None
    do_set_server_state(node=other.node, state="down")
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    # A writer that tells nobody (an admin's direct update) is seen by the row's version.
    queued = Job.objects.filter(state="queued").first() or jobs[-1]
    Job.objects.filter(pk=queued.pk).update(priority=95)
    kept_equals_rebuild()
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    assert incremental.kept_state().mismatches == 0
    drain_all(nodes)


@needs_postgresql
def test_a_planted_divergence_is_caught_counted_and_repaired(
    alice: Any, acme: Any, settings: Any, caplog: Any
) -> None:
    demo_cluster(FABRIC)
    job = submit(alice, acme, gpus=4, lo=4, hi=4)
    run_tick(policy=POLICY)
    kept_equals_rebuild()
    client = redis.Redis.from_url(settings.REDIS_URL)
    before = float(client.hget(TICK_STATS_KEY, incremental.MISMATCH_FIELD) or 0)
    # Behind the kept state's back: one of the job's GPU rows goes, its job row untouched
    # (no writer of this code does that: jobs.holdings saves the job with its rows).
    JobGpu.objects.filter(job=job, rank=3).delete()
    kept = incremental.kept_state()
    cluster = kept.cluster()
    assert cluster is not None
    now = timezone.now()
    mine = Prepared(cluster, kept.allocator(cluster), kept.policy_input(cluster, now))
    reference = rebuild(now, epoch=kept.epoch)  # the kept views' time base
    assert reference is not None
    assert {"holders", "holdings", "snapshot"} <= set(compare(mine, reference))
    settings.TICK_VERIFY_EVERY = 1
    with caplog.at_level(logging.WARNING, logger="control.incremental"):
        assert run_tick(policy=POLICY).ran
    assert "differs from the database in holders, holdings" in caplog.text
    assert incremental.kept_state().mismatches == 1
    assert float(client.hget(TICK_STATS_KEY, incremental.MISMATCH_FIELD) or 0) == before + 1
    exposed = generate_latest(build_registry()).decode()
    assert f"portal_tick_state_mismatches_total {before + 1}" in exposed
    kept_equals_rebuild()  # repaired
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="control.incremental"):
        run_tick(policy=POLICY)  # verified again: now the same
    assert "differs" not in caplog.text
    assert incremental.kept_state().verifications >= 2
    assert incremental.kept_state().mismatches == 1


@needs_postgresql
def test_writes_committed_while_the_verify_reads_are_no_mismatch(
    alice: Any, acme: Any, settings: Any, monkeypatch: Any, caplog: Any
) -> None:
    """The verify pass reads the kept state and the rebuild in one snapshot of the database.

    Here another connection commits a submission and a progress report between the
    two reads (as the web and the report worker do at any moment): read in the
    tick's ``READ COMMITTED`` transaction, the rebuild saw them and the kept state
    did not, and a live run counted three such false mismatches in six minutes.
    """
    demo_cluster(FABRIC)
    running = submit(alice, acme, gpus=2, lo=2, hi=2)
    run_tick(policy=POLICY)
    running.refresh_from_db()
    assert running.state == "running"
    real_rebuild = incremental.rebuild
    written: list[int] = []

    def writes_then_rebuild(now: Any, *, epoch: float | None = None) -> Any:
        def elsewhere() -> None:  # its own thread: its own connection, committed at once
            try:
                written.append(submit(alice, acme, gpus=1, lo=1, hi=1).pk)
                report(running, "progress", 900, step=7, samples_per_s=123.0, world=2)
            finally:
                connection.close()

        writer = threading.Thread(target=elsewhere)
        writer.start()
        writer.join()
        return real_rebuild(now, epoch=epoch)

    monkeypatch.setattr(incremental, "rebuild", writes_then_rebuild)
    settings.TICK_VERIFY_EVERY = 1
    with caplog.at_level(logging.WARNING, logger="control.incremental"):
        assert run_tick(policy=POLICY).ran
    assert written and Job.objects.filter(pk=written[0]).exists()  # the writes did commit
    assert "differs" not in caplog.text
    assert incremental.kept_state().verifications == 1
    assert incremental.kept_state().mismatches == 0
    monkeypatch.setattr(incremental, "rebuild", real_rebuild)
    kept_equals_rebuild()  # and the tick after the verify saw them


@needs_postgresql
def test_a_new_process_and_a_failed_tick_start_from_a_full_read(
    alice: Any, acme: Any, monkeypatch: Any
) -> None:
    demo_cluster(FABRIC)
    for _ in range(3):
        submit(alice, acme, gpus=2, lo=1, hi=4)
    run_tick(policy=POLICY)
    first = incremental.kept_state()
    assert first.rows  # kept after the tick
    incremental.forget()  # the scheduler process was killed; a new one starts empty
    fresh = incremental.kept_state()
    assert fresh is not first and not fresh.rows
    kept_equals_rebuild()
    assert set(fresh.rows) == set(
        Job.objects.filter(state__in=("queued", "running", "scaling")).values_list("pk", flat=True)
    )
    # A tick that fails half-way drops what it kept: its writes rolled back.
    submit(alice, acme, gpus=2, lo=2, hi=2)

    def broken(*args: Any, **kwargs: Any) -> list[int]:
        raise RuntimeError("killed mid-apply")

    monkeypatch.setattr("control.tick.apply_bound", broken)
    with pytest.raises(RuntimeError):
        run_tick(policy=POLICY)
    assert not incremental.has_kept_state()
    monkeypatch.undo()
    assert run_tick(policy=POLICY).ran
    kept_equals_rebuild()


def test_full_rebuild_is_selectable(settings: Any) -> None:
    settings.TICK_INCREMENTAL = False
    assert isinstance(incremental.source_for_tick(), FullRebuild)
    settings.TICK_INCREMENTAL = True
    expected = KeptState if connection.vendor == "postgresql" else FullRebuild
    assert isinstance(incremental.source_for_tick(), expected)


@pytest.mark.skipif(
    connection.vendor == "postgresql", reason="checks the fallback of the other databases"
)
def test_on_sqlite_the_default_setting_rebuilds_and_never_reads_row_versions(
    alice: Any, acme: Any, settings: Any
) -> None:
    """``make run``'s database (SQLite) with the default ``TICK_INCREMENTAL=1``: full rebuilds.

    The kept state's queries (``xmin``, ``ctid``, ``array_agg``) are PostgreSQL's; the
    tick must not reach them, and asking for the kept state directly is refused.
    """
    settings.TICK_INCREMENTAL = True  # the default (portal.settings.base), as make run has it
    demo_cluster(FABRIC)
    jobs = [submit(alice, acme, gpus=2, lo=1, hi=4) for _ in range(3)]
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert run_tick(policy=POLICY).ran
    statements = [q["sql"] for q in queries.captured_queries]
    assert statements  # the ticks did read the cluster
    assert not [sql for sql in statements if "xmin" in sql or "ctid" in sql]
    assert not incremental.has_kept_state()
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state="running").exists()
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL"):
        incremental.kept_state()


@needs_postgresql
def test_kept_job_views_follow_a_renamed_tenant_and_time(alice: Any, acme: Any) -> None:
    """A job's view is kept while its row stands still; its tenant's name still reaches it."""
    demo_cluster(FABRIC)
    jobs = [submit(alice, acme, gpus=2, lo=1, hi=4) for _ in range(2)]
    assert run_tick(policy=POLICY).ran
    kept_equals_rebuild()
    kept = incremental.kept_state()
    cluster = kept.cluster()
    assert cluster is not None
    before = {v.id: v for v in kept.policy_input(cluster, timezone.now()).snapshot.jobs}
    after = kept.policy_input(cluster, timezone.now()).snapshot
    assert all(before[v.id] is v for v in after.jobs)  # unchanged jobs: the same views
    assert after.now > 0  # time runs from the kept state's fixed epoch
    Tenant.objects.filter(pk=acme.pk).update(slug="acme-renamed")  # no job row changes
    kept_equals_rebuild()
    cluster = kept.cluster()
    assert cluster is not None
    renamed = kept.policy_input(cluster, timezone.now()).snapshot
    assert {v.tenant for v in renamed.jobs} == {"acme-renamed"}
    assert len(renamed.jobs) == len(jobs)


@needs_postgresql
def test_a_write_still_open_at_one_refresh_is_read_by_the_next(alice: Any, acme: Any) -> None:
    """The change feed's horizon: a transaction that wrote a job before a refresh and
    commits after it is read by the next refresh, though newer writes were read before.

    The refresh reads the rows written at or above the last refresh's horizon (the
    oldest transaction open then); taking the horizon from the newest write seen
    instead would skip this one for good (its transaction id is older).
    """
    demo_cluster(FABRIC)
    slow, quick = submit(alice, acme, gpus=2, lo=1, hi=4), submit(alice, acme, gpus=1, lo=1, hi=1)
    assert run_tick(policy=POLICY).ran
    kept_equals_rebuild()
    wrote, commit = threading.Event(), threading.Event()

    def open_writer() -> None:  # its own connection: writes, then waits to commit
        try:
            with transaction.atomic():
                Job.objects.filter(pk=slow.pk).update(priority=90)
                wrote.set()
                assert commit.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=open_writer)
    writer.start()
    assert wrote.wait(30)
    Job.objects.filter(pk=quick.pk).update(priority=80)  # a newer transaction, committed
    kept = incremental.kept_state()
    assert kept.cluster() is not None  # reads the quick write; the slow one is not visible
    assert kept.rows[quick.pk].priority == 80 and kept.rows[slow.pk].priority == 50
    commit.set()
    writer.join()
    kept_equals_rebuild()
    assert kept.rows[slow.pk].priority == 90
    assert kept.horizon is not None
    since = incremental._written_since(kept.horizon)  # nothing written since: no job rows
    assert (since.fresh, since.left) == ([], {})


@needs_postgresql
def test_a_tenants_first_job_and_its_tenants_change_reach_the_kept_state(
    alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    """The kept jobs' tenants are read with the job rows: a tenant new to the kept state
    (its first job) is read apart once, then with the others; its quota change is seen."""
    demo_cluster(FABRIC)
    submit(alice, acme, gpus=2, lo=1, hi=4)
    assert run_tick(policy=POLICY).ran
    kept = incremental.kept_state()
    assert set(kept.tenants) == {acme.pk}
    submit(bob, globex, gpus=1, lo=1, hi=1)  # globex's first job
    kept_equals_rebuild()
    assert set(kept.tenants) == {acme.pk, globex.pk}
    Tenant.objects.filter(pk=globex.pk).update(gpu_quota=1)
    kept_equals_rebuild()
    assert kept.tenants[globex.pk].gpu_quota == 1


@needs_postgresql
def test_the_portals_connections_compile_no_plans() -> None:
    """JIT off (settings): the read of thousands of written jobs took 1.2 s, of which
    1.0 s compiling a plan the planner thought costly, 0.2 s doing the work."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)


@needs_postgresql
def test_what_the_reading_transaction_writes_after_its_read_is_read_next(
    alice: Any, acme: Any
) -> None:
    """The tick writes after its read, in the transaction that read (a profile requested,
    a wait noted): those rows come again at the next refresh, though a snapshot leaves
    its own transaction out of those it calls open."""
    demo_cluster(FABRIC)
    first, second = submit(alice, acme, gpus=1, lo=1, hi=1), submit(alice, acme, gpus=1, lo=1, hi=1)
    assert run_tick(policy=POLICY).ran
    kept = incremental.kept_state()

    def elsewhere() -> None:  # a later transaction that ends first: xmax passes ours
        try:
            Job.objects.filter(pk=first.pk).update(attained_gpu_seconds=1.0)
        finally:
            connection.close()

    with transaction.atomic():
        Job.objects.filter(pk=second.pk).update(attained_gpu_seconds=2.0)  # ours has an id
        writer = threading.Thread(target=elsewhere)
        writer.start()
        writer.join()
        Job.objects.filter(pk=first.pk).update(priority=60)
        assert kept.cluster() is not None
        assert kept.rows[first.pk].priority == 60  # its own write, read
        Job.objects.filter(pk=second.pk).update(priority=65)  # after the read
    kept_equals_rebuild()
    assert kept.rows[second.pk].priority == 65


@needs_postgresql
def test_a_long_transaction_elsewhere_does_not_make_every_refresh_read_again(
    alice: Any, acme: Any
) -> None:
    """A transaction left open (a report, a session idle in one) costs the feed only the
    rows it writes: the rows written and read since are not read again at every refresh,
    as they were while the horizon was the oldest open transaction."""
    demo_cluster(FABRIC)
    jobs = [submit(alice, acme, gpus=1, lo=1, hi=1) for _ in range(3)]
    assert run_tick(policy=POLICY).ran
    opened, done = threading.Event(), threading.Event()

    def idle_in_transaction() -> None:  # holds a transaction id, writes no job
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_current_xact_id()")
                opened.set()
                assert done.wait(30)
        finally:
            connection.close()

    idler = threading.Thread(target=idle_in_transaction)
    idler.start()
    try:
        assert opened.wait(30)
        Job.objects.filter(pk__in=[j.pk for j in jobs]).update(priority=70)
        kept = incremental.kept_state()
        assert kept.cluster() is not None and kept.horizon is not None
        assert {kept.rows[j.pk].priority for j in jobs} == {70}
        since = incremental._written_since(kept.horizon)
        assert (since.fresh, since.left) == ([], {})  # read once, not again
    finally:
        done.set()
        idler.join()
    kept_equals_rebuild()


@needs_postgresql
def test_the_kept_states_one_query_reads_the_servers_the_rebuild_reads() -> None:
    """Suspect GPUs (two on one server, one lapsed), a draining server, one never heard from."""
    nodes = demo_cluster(FABRIC)
    now = timezone.now()
    for gpu in (5, 4):
        do_mark_gpu_suspect(gpu=gpu, at=now, seconds=600, reason="slow", job_id=None, by="test")
    do_mark_gpu_suspect(gpu=9, at=now, seconds=600, reason="slow", job_id=None, by="test")
    Gpu.objects.filter(index=9).update(suspect_until=now - timedelta(seconds=1))  # lapsed
    do_set_server_state(node=nodes[2], state="draining")
    Server.objects.filter(node=nodes[3]).update(last_heartbeat=None)
    servers = incremental._read_servers()
    assert servers == read_servers()
    assert [s.suspect for s in servers if s.suspect] == [(4, 5)]
    assert any(s.state == "draining" for s in servers) and any(not s.beating for s in servers)


def checked(
    last: incremental.ServersCheck, at: Any = None
) -> incremental.ServersCheck:  # the next check after ``last``, from a transaction of its own
    with transaction.atomic():
        return incremental._servers_changed(last.horizon, at or last.at, last.count)


@needs_postgresql
def test_the_servers_are_read_again_only_when_what_the_tick_reads_of_them_changed() -> None:
    """Triggers stamp a server or GPU row when its name, place, state, first heartbeat or
    suspect mark changes; a heartbeat does not; a lapsed mark and a deleted server are
    found without a write."""
    nodes = demo_cluster(FABRIC)
    first = incremental._servers_changed(None, None, 0)
    assert first.changed and first.fabric is not None and first.count == len(nodes)
    steady = checked(first)
    assert not steady.changed
    Server.objects.filter(node=nodes[0]).update(last_heartbeat=None)  # as if it never beat
    silent = checked(steady)
    assert silent.changed
    Server.objects.filter(node=nodes[0]).update(last_heartbeat=timezone.now())  # first beat
    beat = checked(silent)
    assert beat.changed
    Server.objects.filter(node=nodes[0]).update(
        last_heartbeat=timezone.now(), agent_info={"version": "x"}
    )
    assert not checked(beat).changed  # a later heartbeat: nothing the tick reads
    do_set_server_state(node=nodes[1], state="draining")
    drained = checked(beat)
    assert drained.changed
    quiet = checked(drained)
    assert not quiet.changed
    now = timezone.now()
    do_mark_gpu_suspect(gpu=3, at=now, seconds=600, reason="slow", job_id=None, by="test")
    marked = checked(quiet)
    assert marked.changed and not checked(marked).changed
    # A mark that lapsed between two checks, no write announcing it: found by its time.
    Gpu.objects.filter(index=4).update(suspect_until=now - timedelta(seconds=60))
    written = checked(marked)
    assert written.changed and not checked(written).changed
    assert checked(written, at=now - timedelta(seconds=120)).changed
    Server.objects.filter(node=nodes[-1]).delete()
    assert checked(quiet).changed  # a server gone: the count says so


def test_kept_aside_shows_what_set_aside_shows_and_keeps_unchanged_views() -> None:
    """``KeptAside`` answers as ``set_aside`` over a random sequence of GPU views and
    set-aside GPUs, and a GPU whose view and setting aside did not change keeps its
    shown view (the object the policy's GPU books compare by identity)."""
    rng = random.Random(5)
    base = [GpuView(i, i // 4, i // 8, GpuState.FREE) for i in range(32)]
    kept = KeptAside()
    shown_before: tuple[GpuView, ...] = ()
    held_before: frozenset[int] = frozenset()
    views_before: tuple[GpuView, ...] = ()
    for _ in range(200):
        for index in rng.sample(range(32), rng.randint(0, 4)):  # some GPUs change hands
            job = rng.choice([None, "job-1", "job-2"])
            state = GpuState.BUSY if job else rng.choice([GpuState.FREE, GpuState.DOWN])
            base[index] = GpuView(index, index // 4, index // 8, state, job)
        held = frozenset(rng.sample(range(32), rng.randint(0, 8)))
        views = tuple(base)
        shown = kept(views, held)
        assert shown == set_aside(views, held)
        for index in range(32) if views_before else ():
            if views[index] is views_before[index] and (index in held) == (index in held_before):
                assert shown[index] is shown_before[index]
        shown_before, held_before, views_before = shown, held, views
    gaps = tuple(GpuView(i, 0, 0, GpuState.FREE) for i in (0, 2, 4))  # not at their index
    assert kept(gaps, {2}) == set_aside(gaps, {2})
