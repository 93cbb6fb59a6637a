"""The job page's live messages name the job's workers, so that its terminal offers the
workers it has now (``jobs.live.patches.live_workers``, in each message and in the page's
snapshot; ``static/js/job.js`` hands them to ``static/js/terminal.js``).

Through the real path: the tick places and resizes the job, the broadcast goes after
commit through the channel layer (Redis) to a browser session's ``/ws/live/`` socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from control.tick import run_tick
from jobs.live.snapshots import job_snapshot
from jobs.models import Job
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from portal.asgi import application
from shells.services import worker_nodes
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Tenant, gpus: int, hi: int) -> Job:
    data = {"name": "w", "workload": "mlp-digits", "gpus": gpus, "min_gpus": 1, "max_gpus": hi}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def session_of(user: Any) -> str:
    """The session cookie of a browser signed in as ``user``."""
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


async def job_socket(cookie: str, job: Job) -> WebsocketCommunicator:
    """A browser session's live socket, subscribed to ``job``'s page."""
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", f"sessionid={cookie}".encode()),
    ]
    comm = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "subscribe", "topic": "job", "id": job.pk})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    return comm


async def job_message(comm: WebsocketCommunicator, job: Job, state: str) -> dict[str, Any]:
    """The next message about ``job`` itself (not a history row) that finds it in ``state``."""
    while True:
        frame = await comm.receive_json_from(timeout=10)
        assert frame.get("type") == "batch", frame
        for event in frame["events"]:
            if event.get("job") == job.pk and event.get("state") == state and "workers" in event:
                return dict(event)


def test_the_pages_messages_name_the_workers_a_shell_may_open_as_the_job_resizes(
    alice: Any, acme: Tenant
) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False  # a profile would resize the job on its own schedule
    acme.save()
    job = submit(alice, acme, gpus=2, hi=4)
    cookie = session_of(alice)

    async def scenario() -> None:
        comm = await job_socket(cookie, job)
        # Placed on the idle cluster at its maximum: four workers, in rank order.
        await sync_to_async(run_tick)(policy="elastic-tiresias")
        started = await job_message(comm, job, "running")
        offered = await sync_to_async(lambda: list(worker_nodes(Job.objects.get(pk=job.pk))))()
        assert len(offered) == 4 and started["workers"] == offered
        await sync_to_async(drain_all)(nodes)
        # Newcomers take two of its GPUs back: a stop-free scale-in, two workers go.
        for _ in range(3):
            await sync_to_async(submit)(alice, acme, gpus=2, hi=2)
        await sync_to_async(run_tick)(policy="elastic-tiresias")
        shrunk = await job_message(comm, job, "scaling")
        kept = await sync_to_async(lambda: list(worker_nodes(Job.objects.get(pk=job.pk))))()
        assert len(kept) == 2 and shrunk["workers"] == kept
        assert set(kept) < set(offered)
        # A job that has ended has no worker to offer.
        await sync_to_async(do_cancel_job)(user=alice, job_id=job.pk)
        assert (await job_message(comm, job, "cancelled"))["workers"] == []
        await comm.disconnect()

    asyncio.run(scenario())


def test_a_job_that_waited_names_its_workers_when_it_starts(alice: Any, acme: Tenant) -> None:
    demo_cluster({"leaves": 1, "spines": 1, "servers_per_leaf": 1, "gpus_per_server": 2})
    blocker = submit(alice, acme, gpus=2, hi=2)
    run_tick(policy="fifo")
    waiting = submit(alice, acme, gpus=2, hi=2)
    cookie = session_of(alice)

    async def scenario() -> None:
        comm = await job_socket(cookie, waiting)
        await sync_to_async(do_cancel_job)(user=alice, job_id=blocker.pk)
        await sync_to_async(run_tick)(policy="fifo")
        started = await job_message(comm, waiting, "running")
        assert (
            started["workers"]
            == await sync_to_async(lambda: list(worker_nodes(Job.objects.get(pk=waiting.pk))))()
        )
        assert len(started["workers"]) == 2
        await comm.disconnect()

    asyncio.run(scenario())
    # A page that reloads its snapshot (a reconnect, a gap) finds the same workers.
    assert job_snapshot(Job.objects.get(pk=waiting.pk))["workers"] == list(
        worker_nodes(Job.objects.get(pk=waiting.pk))
    )
    assert job_snapshot(Job.objects.get(pk=blocker.pk))["workers"] == []
