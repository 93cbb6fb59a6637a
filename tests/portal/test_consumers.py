"""The live-update socket through ``WebsocketCommunicator`` and the real ASGI stack.

The full application (origin check, session auth, URL router) is exercised; the
channel layer is the configured Redis one, so group sends cross the real layer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from devtools.job_steps import move
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.asgi import application
from portal.consumers import CLOSE_UNAUTHENTICATED
from tenancy.models import Tenant
from tests.portal.live_frames import next_event

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def communicator(cookie: str | None = None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def submit(user: Any, tenant: Tenant, name: str = "live") -> Job:
    spec = check_job_spec(tenant=tenant, data={"name": name, "workload": "mlp-digits", "gpus": 1})
    return do_submit_job(user=user, tenant=tenant, spec=spec)


async def subscribe(comm: WebsocketCommunicator, topic: str, ident: int | None = None) -> Any:
    await comm.send_json_to({"type": "subscribe", "topic": topic, "id": ident})
    return await comm.receive_json_from(timeout=5)


def test_unauthenticated_socket_is_refused() -> None:
    async def scenario() -> None:
        connected, code = await communicator().connect()
        assert not connected and code == CLOSE_UNAUTHENTICATED

    run(scenario)


def test_bad_session_cookie_is_refused() -> None:
    async def scenario() -> None:
        connected, _ = await communicator("not-a-session").connect()
        assert not connected

    run(scenario)


def test_foreign_origin_is_refused(alice: Any) -> None:
    cookie = session_cookie(alice)

    async def scenario() -> None:
        comm = WebsocketCommunicator(
            application,
            "/ws/live/",
            headers=[
                (b"origin", b"http://evil.example"),
                (b"cookie", f"sessionid={cookie}".encode()),
            ],
        )
        connected, _ = await comm.connect()
        assert not connected

    run(scenario)


def test_member_joins_own_tenant_but_not_another(alice: Any, acme: Tenant, globex: Tenant) -> None:
    cookie = session_cookie(alice)
    foreign_job = submit(globex.memberships.get().user, globex, "secret")

    async def scenario() -> None:
        comm = communicator(cookie)
        connected, _ = await comm.connect()
        assert connected
        assert (await subscribe(comm, "tenant", acme.pk))["type"] == "subscribed"
        refused = await subscribe(comm, "tenant", globex.pk)
        assert refused["type"] == "subscribe.refused"
        # another tenant's job is refused exactly like a job that does not exist
        other = await subscribe(comm, "job", foreign_job.pk)
        missing = await subscribe(comm, "job", 999_999)
        assert other == {**missing, "id": foreign_job.pk}
        assert (await subscribe(comm, "cluster"))["type"] == "subscribe.refused"
        assert (await subscribe(comm, "tenant", "1"))["type"] == "subscribe.refused"
        assert (await subscribe(comm, "nonsense", 1))["type"] == "subscribe.refused"
        # events of the foreign tenant never reach this socket
        await sync_to_async(move)(
            job_id=foreign_job.pk, to_state="running", reason="test", parallelism=1
        )
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()

    run(scenario)


def test_admin_joins_cluster_and_any_tenant(make_user: Callable[..., Any], globex: Tenant) -> None:
    admin = make_user("root", staff=True)
    cookie = session_cookie(admin)

    async def scenario() -> None:
        comm = communicator(cookie)
        assert (await comm.connect())[0]
        assert (await subscribe(comm, "cluster"))["type"] == "subscribed"
        assert (await subscribe(comm, "tenant", globex.pk))["type"] == "subscribed"
        await comm.disconnect()

    run(scenario)


def test_events_arrive_after_commit_only(alice: Any, acme: Tenant) -> None:
    cookie = session_cookie(alice)
    job = submit(alice, acme)

    def change_in_transaction(proceed: Any, committed: Any) -> None:
        with transaction.atomic():
            move(job_id=job.pk, to_state="running", reason="placed", parallelism=2)
            proceed.set()  # the change is made but not yet committed
            committed.wait(5)

    async def scenario() -> None:
        import threading

        comm = communicator(cookie)
        assert (await comm.connect())[0]
        assert (await subscribe(comm, "job", job.pk))["type"] == "subscribed"
        proceed, committed = threading.Event(), threading.Event()
        loop = asyncio.get_running_loop()
        worker = loop.run_in_executor(None, change_in_transaction, proceed, committed)
        await loop.run_in_executor(None, proceed.wait, 5)
        assert await comm.receive_nothing(timeout=0.5), "event sent before commit"
        committed.set()
        await worker
        event = await next_event(comm, "job.updated")
        row = {
            "type": "job.updated",
            "job": job.pk,
            "tenant": acme.pk,
            "state": "running",
            "parallelism": 2,
            "step": 0,
            "samples_per_s": None,
            "attained_gpu_seconds": 0.0,
        }
        assert {k: event[k] for k in row} == row
        # the job's page also gets what it shows besides the row (jobs.live.patches)
        assert event["started_at"] is not None and event["finished_at"] is None
        assert (event["min_gpus"], event["max_gpus"], event["restarts"]) == (1, 1, 0)
        await comm.disconnect()

    run(scenario)


def test_rolled_back_change_sends_nothing(alice: Any, acme: Tenant) -> None:
    cookie = session_cookie(alice)

    def submit_and_roll_back() -> None:
        try:
            with transaction.atomic():
                submit(alice, acme, "doomed")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass

    async def scenario() -> None:
        comm = communicator(cookie)
        assert (await comm.connect())[0]
        assert (await subscribe(comm, "tenant", acme.pk))["type"] == "subscribed"
        await sync_to_async(submit_and_roll_back)()
        assert await comm.receive_nothing(timeout=0.5)
        created = await sync_to_async(submit)(alice, acme, "kept")
        event = await next_event(comm, "job.created")
        assert event["job"] == created.pk
        await comm.disconnect()

    run(scenario)
    assert list(Job.objects.values_list("name", flat=True)) == ["kept"]


def test_unsubscribe_and_ping(alice: Any, acme: Tenant) -> None:
    cookie = session_cookie(alice)

    async def scenario() -> None:
        comm = communicator(cookie)
        assert (await comm.connect())[0]
        await subscribe(comm, "tenant", acme.pk)
        await comm.send_json_to({"type": "unsubscribe", "topic": "tenant", "id": acme.pk})
        assert (await comm.receive_json_from())["type"] == "unsubscribed"
        await sync_to_async(submit)(alice, acme)
        assert await comm.receive_nothing(timeout=0.5)
        await comm.send_json_to({"type": "ping", "t": 7})
        assert await comm.receive_json_from() == {"type": "pong", "t": 7}
        await comm.send_json_to({"type": "bogus"})
        assert (await comm.receive_json_from())["type"] == "error"
        await comm.disconnect()

    run(scenario)
