"""Live fan-out: batches per group with consecutive seqs, coalescing, tenant patches.

Through ``WebsocketCommunicator`` and the real ASGI stack, the configured Redis
channel layer and the real coalescer thread; a gap is made the way a real one
happens (a batch sent while the socket was not in the group).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from devtools.job_steps import move
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.asgi import application
from portal.consumers import batch_allowed
from portal.settings.live import BACKENDS, channel_layers
from tenancy.live_access import user_group
from tenancy.models import Tenant
from utilities.realtime import (
    Coalescer,
    Message,
    broadcast_on_commit,
    coalesce,
    coalescer,
    current_seq,
    tenant_group,
    wait_finished,
)

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user: Any) -> tuple[Client, str]:
    client = Client()
    client.force_login(user)
    return client, str(client.cookies["sessionid"].value)


async def opened(cookie: str, topic: str, ident: int) -> WebsocketCommunicator:
    # What the test's setup broadcast goes out first: under load a window still open
    # would merge it into the batch the test is about to read.
    assert await sync_to_async(coalescer().wait_idle)()
    comm = WebsocketCommunicator(
        application,
        "/ws/live/",
        headers=[
            (b"origin", b"http://testserver"),
            (b"host", b"testserver"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ],
    )
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "topic": topic, "id": ident})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    return comm


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def submit(user: Any, tenant: Tenant, name: str = "live") -> Job:
    spec = check_job_spec(tenant=tenant, data={"name": name, "workload": "mlp-digits", "gpus": 1})
    return do_submit_job(user=user, tenant=tenant, spec=spec)


async def batches_until(
    comm: WebsocketCommunicator, done: Callable[[list[Any]], bool]
) -> list[Any]:
    """Frames until ``done(frames)``; every one must be a batch."""
    frames: list[Any] = []
    while not done(frames):
        frame = await comm.receive_json_from(timeout=5)
        assert frame["type"] == "batch", frame
        frames.append(frame)
    return frames


def events(frames: list[Any], kind: str) -> list[Any]:
    return [e for f in frames for e in f["events"] if e["type"] == kind]


def test_seqs_are_consecutive_and_the_snapshot_carries_the_last(alice: Any, acme: Tenant) -> None:
    client, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        for n in range(4):
            await sync_to_async(submit)(alice, acme, f"job-{n}")
        frames = await batches_until(comm, lambda fs: len(events(fs, "job.created")) == 4)
        seqs = [f["seq"] for f in frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        assert {(f["topic"], f["id"]) for f in frames} == {("tenant", acme.pk)}
        assert await comm.receive_nothing(timeout=0.3)
        snap = json.loads(
            (await sync_to_async(client.get)(f"/live/tenants/{acme.pk}/jobs.json")).content
        )
        assert snap["seq"] == seqs[-1]  # the page applies only batches after it
        await comm.disconnect()

    run(scenario)


def test_a_missed_batch_shows_as_a_gap_and_the_snapshot_covers_it(alice: Any, acme: Tenant) -> None:
    client, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        await sync_to_async(submit)(alice, acme, "seen")
        first = await batches_until(comm, lambda fs: bool(events(fs, "job.created")))
        # the socket leaves the group; a batch goes out meanwhile (as when the layer
        # dropped it, or the page was asleep); then it is back in the group
        await comm.send_json_to({"type": "unsubscribe", "topic": "tenant", "id": acme.pk})
        assert (await comm.receive_json_from(timeout=5))["type"] == "unsubscribed"
        missed = await sync_to_async(submit)(alice, acme, "missed")
        await asyncio.sleep(0.5)
        await comm.send_json_to({"type": "subscribe", "topic": "tenant", "id": acme.pk})
        assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
        await asyncio.sleep(0.2)  # past the coalescing window: the next change is its own batch
        await sync_to_async(submit)(alice, acme, "after")
        after = await batches_until(comm, lambda fs: bool(events(fs, "job.created")))
        assert after[0]["seq"] > first[-1]["seq"] + 1, "the lost batch leaves a gap in seqs"
        snap = json.loads(
            (await sync_to_async(client.get)(f"/live/tenants/{acme.pk}/jobs.json")).content
        )
        assert snap["seq"] == after[-1]["seq"]
        assert missed.pk in {row["id"] for row in snap["jobs"]}  # the reload brings it back
        await comm.disconnect()

    run(scenario)


@pytest.mark.parametrize("background", [True, False], ids=["finisher-thread", "committing-thread"])
def test_one_transaction_is_one_batch_with_counts_and_queue(
    alice: Any, acme: Tenant, background: bool, settings: Any
) -> None:
    """Whichever thread builds the counts and queue, they go with the jobs' events, once."""
    _, cookie = signed_in(alice)
    jobs = [submit(alice, acme, f"j{n}") for n in range(5)]
    for rank, job in enumerate(jobs, start=1):
        Job.objects.filter(pk=job.pk).update(queue_position=rank)
    # Only now: the test database is SQLite's shared-cache memory database on the embedded
    # defaults, where a finisher thread counting jobs while this thread inserts the next one
    # fails the insert at once ("database table is locked"; no busy wait in shared cache).
    settings.LIVE_FINISH_IN_BACKGROUND = background

    def place_three() -> None:
        with transaction.atomic():
            for job in jobs[:3]:
                move(job_id=job.pk, to_state="running", reason="placed", parallelism=2)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        await sync_to_async(place_three)()
        frame = await comm.receive_json_from(timeout=5)
        kinds = [e["type"] for e in frame["events"]]
        assert kinds == ["job.updated"] * 3 + ["tenant.counts", "tenant.queue"], kinds
        counts = frame["events"][3]
        assert counts["counts"]["running"] == 3 and counts["counts"]["queued"] == 2
        assert counts["in_use"] == 6
        # the jobs behind the three that left the queue moved up to 1 and 2
        queue = frame["events"][4]["positions"]
        assert queue == {str(jobs[3].pk): 1, str(jobs[4].pk): 2}
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    run(scenario)
    assert wait_finished()  # nothing of it still reads while the teardown empties the tables


def test_another_tenants_queue_moves_are_told_without_its_jobs(
    alice: Any, acme: Tenant, globex: Tenant
) -> None:
    _, cookie = signed_in(alice)
    theirs = submit(globex.memberships.get().user, globex, "theirs")
    mine = submit(alice, acme, "mine")
    Job.objects.filter(pk=theirs.pk).update(queue_position=1)
    Job.objects.filter(pk=mine.pk).update(queue_position=2)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        await sync_to_async(move)(job_id=theirs.pk, to_state="running", reason="t", parallelism=1)
        frame = await comm.receive_json_from(timeout=5)
        assert frame["events"] == [
            {"type": "tenant.queue", "tenant": acme.pk, "positions": {str(mine.pk): 1}}
        ]
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    run(scenario)


def test_a_burst_within_the_window_is_one_message(alice: Any, acme: Tenant) -> None:
    """Five transactions close together: the first goes at once, the other four together."""
    _, cookie = signed_in(alice)
    group = tenant_group(acme.pk)
    sender = Coalescer(window_s=0.4)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        sender.submit([Message((group,), {"type": "n", "tenant": acme.pk, "n": 0})])
        first = await comm.receive_json_from(timeout=5)
        for n in range(1, 5):
            counts = {"type": "tenant.counts", "tenant": acme.pk, "n": n}
            sender.submit(
                [
                    Message((group,), {"type": "n", "tenant": acme.pk, "n": n}),
                    Message((group,), counts, replaces="counts"),
                ]
            )
        second = await comm.receive_json_from(timeout=5)
        assert [e["n"] for e in first["events"]] == [0]
        assert [(e["type"], e["n"]) for e in second["events"]] == [
            ("n", 1),
            ("n", 2),
            ("n", 3),
            ("n", 4),
            ("tenant.counts", 4),  # only the latest counts: they are absolute
        ]
        assert second["seq"] == first["seq"] + 1
        assert await comm.receive_nothing(timeout=0.6)
        await comm.disconnect()

    run(scenario)
    assert sender.wait_idle() and sender.sent_messages == 2
    assert current_seq(group) >= 2


def test_coalesce_keeps_order_and_the_latest_of_each_key() -> None:
    a, b, c = {"type": "a"}, {"type": "b"}, {"type": "c"}
    assert coalesce([(None, a), ("k", b), (None, c), ("k", a)]) == [a, c, a]
    assert coalesce([]) == []


@pytest.mark.parametrize(
    ("group", "relayed"),
    [("tenant-3", True), ("tenant-4", False), (None, False), (["tenant-3"], False), (3, False)],
)
def test_batches_only_for_groups_still_joined(group: Any, relayed: bool) -> None:
    assert batch_allowed(group, {"tenant-3": ("tenant", 3)}) is relayed


def test_a_forged_batch_for_a_foreign_group_is_not_relayed(
    alice: Any, acme: Tenant, globex: Tenant
) -> None:
    """A batch naming another tenant's group, delivered through a group the socket is in."""
    _, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, "tenant", acme.pk)
        forged = {"type": "portal.batch", "group": tenant_group(globex.pk), "seq": 1}
        await get_channel_layer().group_send(
            user_group(alice.pk), {**forged, "events": [{"type": "secret"}]}
        )
        assert await comm.receive_nothing(timeout=0.5)
        await comm.send_json_to({"type": "ping", "t": 1})
        assert await comm.receive_json_from(timeout=5) == {"type": "pong", "t": 1}
        await comm.disconnect()

    run(scenario)


BURST_GROUPS = 1000


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_a_transaction_that_touches_1000_groups_loses_no_batch(kind: str, settings: Any) -> None:
    """A tick that changes 1,000 jobs: every group's batch arrives, numbered 1, none refused.

    Sent all at once, the sends needed more connections than the layer's pool has
    (redis MaxConnectionsError) and those batches were lost.
    """
    settings.CHANNEL_LAYERS = channel_layers(
        kind, redis_url=settings.REDIS_URL, socket_timeout_s=30
    )
    run_id = uuid.uuid4().hex[:8]
    groups = [f"burst-{run_id}-{n}" for n in range(BURST_GROUPS)]
    sender = coalescer()
    assert sender.wait_idle()
    failed_before = sender.failed_messages

    def one_transaction() -> None:
        with transaction.atomic():
            for n, group in enumerate(groups):
                broadcast_on_commit((group,), {"type": "job.updated", "job": n})

    async def scenario() -> None:
        layer = get_channel_layer()
        # Four listeners, each in a quarter of the groups (a channel holds at most
        # 1,000 messages in the core layer).
        listeners = [await layer.new_channel() for _ in range(4)]
        for n, group in enumerate(groups):
            await layer.group_add(group, listeners[n % 4])
        await sync_to_async(one_transaction)()
        received: dict[str, Any] = {}

        async def drain(channel: str, expected: int) -> None:
            while expected:
                message = await asyncio.wait_for(layer.receive(channel), timeout=20)
                received[message["group"]] = message
                expected -= 1

        await asyncio.gather(*(drain(c, len(groups[n::4])) for n, c in enumerate(listeners)))
        assert set(received) == set(groups)
        for n, group in enumerate(groups):
            assert received[group]["seq"] == 1
            assert received[group]["events"] == [{"type": "job.updated", "job": n}]
        for n, group in enumerate(groups):
            await layer.group_discard(group, listeners[n % 4])

    run(scenario)
    assert sender.wait_idle(timeout=20)
    assert sender.failed_messages == failed_before
    assert all(current_seq(group) == 1 for group in groups[:: BURST_GROUPS // 10])
