"""A Redis restart is not a fault of the job: the runtime and the agent ride it out.

The server is a real redis-server of the test's own (append-only file), stopped
and started again; ``key-load-delay`` makes it answer ``LOADING``
(``BusyLoadingError``) for seconds after a restart, as a large file would.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.elastic import JobRun, check_samples
from workers.agent.celery_app import make_app
from workers.agent.redis_acl import (
    job_url,
    job_user,
    job_user_exists,
    restore_job_user,
    url_for,
)
from workers.agent.reports import send_report
from workers.clock import SYSTEM_CLOCK
from workers.elastic.cli import WorkerArgumentError, parse_options
from workers.elastic.constants import ALIVE_MS, BEAT_S, LEASE_MS
from workers.elastic.keys import JobKeys
from workers.elastic.lease import Lease, peer_is_dead
from workers.elastic.redis_client import (
    BACKOFF_CAP_S,
    MAX_OUTAGE_S,
    OutageLog,
    connect,
    outage_retry,
    retries_for,
)
from workers.elastic.sampler import ElasticSampler
from workers.protocol import Heartbeat
from workers.tests.redis_server import OwnRedis

KEYS_FOR_SLOW_LOAD = 20_000
"""With ``load_delay_us=200``: about four seconds of ``LOADING`` after a restart."""


def fill(server: OwnRedis, keys: int) -> None:
    """Write ``keys`` small keys into db 15, so that loading the file takes a while."""
    client = redis.Redis.from_url(server.url(15))
    pipe = client.pipeline(transaction=False)
    for i in range(keys):
        pipe.set(f"ballast:{i}", "x")
    pipe.execute()
    client.close()


def restart_in_background(server: OwnRedis, down_s: float) -> threading.Thread:
    """Restart ``server`` (down for ``down_s``) while the test goes on."""
    thread = threading.Thread(target=server.restart, args=(down_s,), daemon=True)
    thread.start()
    return thread


# -- the retry budget (pure) ------------------------------------------------------------
@pytest.mark.parametrize("outage_s", [0.0, 0.3, 1.0, 60.0, 600.0, MAX_OUTAGE_S])
def test_retries_cover_the_outage(outage_s: float) -> None:
    retries = retries_for(outage_s)
    backoff = outage_retry(outage_s, OutageLog())._backoff
    pauses = [backoff.compute(n) for n in range(1, retries + 1)]  # no overflow at any count
    assert all(0 < pause <= BACKOFF_CAP_S for pause in pauses)
    assert sum(pauses) >= outage_s
    assert sum(pauses[:-1]) < outage_s or retries == 0  # not a retry more than needed


@pytest.mark.parametrize("hostile", [-1.0, math.nan, math.inf])
def test_retry_budget_refuses_hostile_outages(hostile: float) -> None:
    with pytest.raises(ValueError):
        retries_for(hostile)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e9"])
def test_worker_command_line_refuses_hostile_outages(value: str) -> None:
    argv = ["--job", "j", "--worker", "w", "--workload", "mlp-digits", "--batch-size", "8"]
    argv += ["--store-url", "/tmp/x", "--redis-url", "redis://127.0.0.1/7"]
    assert parse_options(argv).redis_outage_s == 60.0
    with pytest.raises(WorkerArgumentError, match="redis-outage-s"):
        parse_options([*argv, "--redis-outage-s", value])


def test_outage_log_settles_a_key_lifetime_after_the_last_failure() -> None:
    log = OutageLog()
    assert log.settled(3.0, now=0.0)  # Redis never failed here
    log.note_failure(now=100.0)
    assert not log.settled(3.0, now=102.9)
    assert log.settled(3.0, now=103.0)


# -- clients against a restarted server --------------------------------------------------
@pytest.fixture
def slow_loading(tmp_path: Path) -> Iterator[OwnRedis]:
    """A server that answers LOADING for seconds after each restart."""
    server = OwnRedis(tmp_path / "slow-redis", load_delay_us=200)
    server.start()
    fill(server, KEYS_FOR_SLOW_LOAD)
    yield server
    server.stop()


def test_a_client_of_today_fails_while_redis_loads(slow_loading: OwnRedis) -> None:
    """The gap: the client the runtime used to build gives up on LOADING."""
    plain = redis.Redis.from_url(slow_loading.url(0))
    plain.set("k", "v")
    slow_loading.restart()
    with pytest.raises(redis.exceptions.BusyLoadingError):
        for _ in range(3):
            plain.get("k")
    slow_loading.wait_loaded()


def test_a_connected_client_rides_out_a_restart_and_the_loading(slow_loading: OwnRedis) -> None:
    log = OutageLog()
    client = connect(slow_loading.url(0), outage_s=30.0, outages=log)
    client.set("k", "v")
    restarted = restart_in_background(slow_loading, down_s=1.0)
    time.sleep(0.2)  # the server is down now
    started = time.monotonic()
    assert client.get("k") == "v"  # down, then loading: waited for, not raised
    waited = time.monotonic() - started
    restarted.join()
    assert waited > 1.0, waited
    assert log.last_failure() is not None and not log.settled(ALIVE_MS / 1000)


def test_a_connected_client_gives_up_after_its_outage(own_redis: OwnRedis) -> None:
    client = connect(own_redis.url(0), outage_s=0.5, outages=OutageLog())
    client.ping()
    own_redis.stop()
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    assert 0.5 <= time.monotonic() - started < 5.0
    own_redis.start()


def test_refused_credentials_are_raised_at_once_not_waited_on(own_redis: OwnRedis) -> None:
    """A wrong password is no outage: the worker must fail now, not after a minute."""
    url = own_redis.url(0).replace("redis://", "redis://nobody:wrong@")
    client = connect(url, outage_s=30.0, outages=OutageLog())
    started = time.monotonic()
    with pytest.raises(redis.exceptions.AuthenticationError):
        client.ping()
    assert time.monotonic() - started < 2.0


def test_a_job_user_a_restart_lost_is_waited_for_until_its_agent_makes_it_again(
    own_redis: OwnRedis,
) -> None:
    """Once its credentials worked, a refusal after a restart is an outage, not a fault."""
    admin = redis.Redis.from_url(own_redis.url(0))
    job = f"t{uuid.uuid4().hex[:8]}"
    client = connect(job_url(admin, own_redis.url(0), job), outage_s=20.0, outages=OutageLog())
    key = JobKeys(job).k("kept")
    client.set(key, "1")
    own_redis.restart()
    admin = redis.Redis.from_url(own_redis.url(0))
    assert not job_user_exists(admin, job)  # the restart lost it
    agent = threading.Timer(1.0, restore_job_user, (admin, job))  # the agent's next heartbeat
    agent.start()
    started = time.monotonic()
    assert client.get(key) == "1"
    assert 1.0 <= time.monotonic() - started < 10.0
    assert not restore_job_user(admin, job)  # there again: nothing to do
    # A client whose credentials never worked is still refused at once.
    stranger = connect(url_for(own_redis.url(0), job_user(job), "wrong"), outage_s=20.0,
                       outages=OutageLog())  # fmt: skip
    started = time.monotonic()
    with pytest.raises(redis.exceptions.AuthenticationError):
        stranger.ping()
    assert time.monotonic() - started < 2.0


# -- liveness after an outage -------------------------------------------------------------
def test_a_lapsed_liveness_key_is_no_death_right_after_an_outage(own_redis: OwnRedis) -> None:
    log = OutageLog()
    client = connect(own_redis.url(0), outage_s=10.0, outages=log)
    keys = JobKeys(f"t{uuid.uuid4().hex[:8]}")
    client.set(keys.alive("w1"), "1", px=ALIVE_MS)
    assert not peer_is_dead(client, keys, "w1", log)
    client.delete(keys.alive("w1"))
    assert peer_is_dead(client, keys, "w1", log)  # no outage: a lapsed key is a death
    log.note_failure()
    assert not peer_is_dead(client, keys, "w1", log)  # it may have lapsed with the outage
    log.note_failure(now=time.monotonic() - ALIVE_MS / 1000 - BEAT_S)
    assert peer_is_dead(client, keys, "w1", log)


def test_the_leader_reclaims_its_lapsed_lease_before_anyone_takes_it(own_redis: OwnRedis) -> None:
    log = OutageLog()
    client = connect(own_redis.url(0), outage_s=10.0, outages=log)
    keys = JobKeys(f"t{uuid.uuid4().hex[:8]}")
    leader = Lease(client, keys, "w0", SYSTEM_CLOCK, log)
    other = Lease(client, keys, "w1", SYSTEM_CLOCK, log)
    leader.claim_first()
    client.delete(keys.leader)  # lapsed while Redis was away
    log.note_failure()
    assert not other.take()  # not the leader's death: left to the leader
    leader._last_refresh -= 2 * BEAT_S  # its next refresh is due
    assert leader.refresh() and leader.holder() == "w0"
    client.delete(keys.leader)
    log.note_failure(now=time.monotonic() - LEASE_MS / 1000 - BEAT_S)
    assert other.take()  # long after the outage: a lapsed lease is a dead leader's
    leader._last_refresh -= 2 * BEAT_S
    assert not leader.refresh()  # another holds it now


# -- the agent's reports ------------------------------------------------------------------
def test_a_report_sent_while_the_broker_restarts_is_delivered(own_redis: OwnRedis) -> None:
    app = make_app(own_redis.url(0))
    queue = f"reports-{uuid.uuid4().hex[:6]}"
    beat = Heartbeat(node="n1", device="cpu", slots=1, free_slots=(0,), workers=())
    assert send_report(beat, key=b"k" * 32, queue=queue, app=app)
    restarted = restart_in_background(own_redis, down_s=2.0)
    time.sleep(0.2)
    assert send_report(beat, key=b"k" * 32, queue=queue, app=app)  # retried, not lost
    restarted.join()
    assert redis.Redis.from_url(own_redis.url(0)).llen(queue) == 2


# -- a training job across a restart --------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_trains_through_a_redis_restart(slow_loading: OwnRedis, tmp_path: Path) -> None:
    """2 workers; Redis down 4 s (longer than every TTL) then loading for seconds: no death."""
    # A worker held up by the outage must not fail its peer's all-reduce: deaths are found
    # by liveness keys in ~3 s anyway, so the sync timeout only bounds waits, here generously
    # (at 10 s a loaded machine failed this test 1 run in 3).
    job = JobRun(
        slow_loading.url(0), f"t{uuid.uuid4().hex[:8]}", tmp_path / "job", sync_timeout_s=60.0
    )
    try:
        job.start_initial(2)
        job.wait_step(20)
        slow_loading.restart(down_s=4.0)
        slow_loading.wait_loaded()
        before = job.events[-1][1]["step"] if job.events else 0
        job.wait_step(int(before) + 30, timeout=120)
        stopped = job.stop_and_wait(timeout=120)
        codes = job.wait_exit()
        assert codes == {"w0": 0, "w1": 0}, (codes, job.tail())
        kinds = {event["kind"] for _id, event in job.events}
        assert not kinds & {"worker_failed", "recovered", "failed"}, (kinds, job.tail())
        sampler = ElasticSampler(1797, job.batch_size, job.args["seed"])
        check_samples(job.step_records(), sampler, stopped)
        raw = job.step_records_raw()
        assert len(raw) == 2 * stopped, "a step ran twice (replayed) or was lost"
    finally:
        job.terminate()
