"""Live sockets lose what their user may no longer see: logout, removal, deactivation, expiry.

Through the real ASGI application (origin check, session auth, router) and the
configured Redis channel layer: the signals' control messages cross the real layer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.test import Client, override_settings
from django.utils import timezone

from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.asgi import application
from portal.consumers import CLOSE_UNAUTHENTICATED, event_allowed
from tenancy.live_access import session_digest, user_group
from tenancy.models import Role, Tenant
from tenancy.services import do_add_member, do_remove_member
from tests.portal.live_frames import next_event
from utilities.realtime import CLUSTER_GROUP, job_group, tenant_group

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user: Any) -> tuple[Client, str]:
    """A browser signed in as ``user``: its client (to log out with) and session cookie."""
    client = Client()
    client.force_login(user)
    return client, str(client.cookies["sessionid"].value)


def socket(cookie: str, origin: bytes = b"http://testserver") -> WebsocketCommunicator:
    headers = [(b"origin", origin), (b"host", b"testserver")]
    headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def submit(user: Any, tenant: Tenant, name: str = "live") -> Job:
    spec = check_job_spec(tenant=tenant, data={"name": name, "workload": "mlp-digits", "gpus": 1})
    return do_submit_job(user=user, tenant=tenant, spec=spec)


async def opened(cookie: str, *topics: tuple[str, int | None]) -> WebsocketCommunicator:
    comm = socket(cookie)
    connected, _ = await comm.connect()
    assert connected
    for topic, ident in topics:
        await comm.send_json_to({"type": "subscribe", "topic": topic, "id": ident})
        assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"
    return comm


async def closed_with(comm: WebsocketCommunicator, timeout: float = 5) -> int:
    """The close code the server sent (messages before it are skipped)."""
    while True:
        message = await comm.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return int(message["code"])


def test_logout_closes_the_sessions_sockets_only(alice: Any, acme: Tenant) -> None:
    browser, cookie = signed_in(alice)
    _, other_cookie = signed_in(alice)  # the same user on another device

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        other = await opened(other_cookie, ("tenant", acme.pk))
        response = await sync_to_async(browser.post)("/logout/")
        assert response.status_code == 302
        assert await closed_with(comm) == CLOSE_UNAUTHENTICATED
        await comm.disconnect()
        # the other session still follows the tenant
        job = await sync_to_async(submit)(alice, acme)
        event = await next_event(other, "job.created")
        assert event["type"] == "job.created" and event["job"] == job.pk
        await other.disconnect()

    run(scenario)


def test_removed_member_stops_receiving_the_tenants_events(
    alice: Any, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    owner = acme.memberships.get(role=Role.OWNER).user
    earlier = submit(owner, acme, "earlier")
    _, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk), ("job", earlier.pk))
        await sync_to_async(do_remove_member)(tenant=acme, user=alice)
        revoked = {
            (m["topic"], m["id"])
            for m in [await comm.receive_json_from(timeout=5) for _ in range(2)]
            if m["type"] == "subscription.revoked"
        }
        assert revoked == {("tenant", acme.pk), ("job", earlier.pk)}
        await sync_to_async(submit)(owner, acme, "after removal")
        assert await comm.receive_nothing(timeout=0.5)
        # the socket stays open for the rest, and cannot subscribe again
        await comm.send_json_to({"type": "subscribe", "topic": "tenant", "id": acme.pk})
        assert (await comm.receive_json_from(timeout=5))["type"] == "subscribe.refused"
        await comm.disconnect()

    run(scenario)


def test_role_change_keeps_what_the_new_role_may_see(alice: Any, acme: Tenant) -> None:
    owner = acme.memberships.get(role=Role.OWNER).user
    _, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        await sync_to_async(do_add_member)(tenant=acme, user=alice, role=Role.VIEWER)
        job = await sync_to_async(submit)(owner, acme)
        event = await next_event(comm, "job.created")  # no revocation came before it
        assert event["type"] == "job.created" and event["job"] == job.pk
        await comm.disconnect()

    run(scenario)


def test_deactivated_user_is_disconnected(alice: Any, acme: Tenant) -> None:
    _, cookie = signed_in(alice)

    def deactivate() -> None:
        alice.is_active = False
        alice.save(update_fields=["is_active"])

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        await sync_to_async(deactivate)()
        assert await closed_with(comm) == CLOSE_UNAUTHENTICATED
        await comm.disconnect()

    run(scenario)


def test_admin_who_loses_staff_leaves_the_cluster_topic(make_user: Callable[..., Any]) -> None:
    admin = make_user("root", staff=True)
    _, cookie = signed_in(admin)

    def demote() -> None:
        admin.is_staff = False
        admin.save(update_fields=["is_staff"])

    async def scenario() -> None:
        comm = await opened(cookie, ("cluster", None))
        await sync_to_async(demote)()
        message = await comm.receive_json_from(timeout=5)
        assert message == {"type": "subscription.revoked", "topic": "cluster", "id": None}
        await comm.disconnect()

    run(scenario)


@override_settings(LIVE_RECHECK_SECONDS=0.2)
def test_expired_session_is_closed_by_the_periodic_recheck(alice: Any, acme: Tenant) -> None:
    _, cookie = signed_in(alice)

    def expire() -> None:
        Session.objects.filter(session_key=cookie).update(
            expire_date=timezone.now() - timedelta(seconds=1)
        )

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        assert await comm.receive_nothing(timeout=0.6)  # still valid: re-checks pass quietly
        await sync_to_async(expire)()
        assert await closed_with(comm, timeout=3) == CLOSE_UNAUTHENTICATED
        await comm.disconnect()

    run(scenario)


@override_settings(LIVE_RECHECK_SECONDS=0.2)
def test_password_change_elsewhere_ends_old_sessions_sockets(alice: Any, acme: Tenant) -> None:
    _, cookie = signed_in(alice)

    def change_password() -> None:
        alice.set_password("a-whole-new-passphrase")
        alice.save(update_fields=["password"])

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        await sync_to_async(change_password)()
        assert await closed_with(comm, timeout=3) == CLOSE_UNAUTHENTICATED
        await comm.disconnect()

    run(scenario)


def test_forged_session_end_for_another_session_closes_nothing(alice: Any, acme: Tenant) -> None:
    """A ``session.ended`` must name this socket's session (by digest) to close it."""
    _, cookie = signed_in(alice)

    async def scenario() -> None:
        comm = await opened(cookie, ("tenant", acme.pk))
        layer = get_channel_layer()
        for forged in ("", "x" * 64, session_digest("another-session"), None):
            await layer.group_send(
                user_group(alice.pk), {"type": "session.ended", "session": forged}
            )
        await comm.send_json_to({"type": "ping", "t": 1})
        assert await comm.receive_json_from(timeout=5) == {"type": "pong", "t": 1}
        await comm.disconnect()

    run(scenario)


@pytest.mark.parametrize(
    ("event", "joined", "relayed"),
    [
        ({"type": "job.updated", "job": 7, "tenant": 3}, {tenant_group(3)}, True),
        ({"type": "job.updated", "job": 7, "tenant": 3}, {job_group(7)}, True),
        ({"type": "job.updated", "job": 7, "tenant": 3}, {tenant_group(4)}, False),
        ({"type": "job.updated", "job": 7, "tenant": 3}, set(), False),
        ({"type": "job.log", "job": 7}, {tenant_group(3)}, False),
        ({"type": "topology.changed"}, {CLUSTER_GROUP}, True),
        ({"type": "topology.changed"}, {tenant_group(3)}, False),
        ({"type": "job.updated", "job": "7", "tenant": "3"}, {tenant_group(3)}, False),
        ("not a dict", {tenant_group(3)}, False),
    ],
)
def test_event_allowed_only_for_groups_still_joined(
    event: Any, joined: set[str], relayed: bool
) -> None:
    """Events already queued for a group the socket just left are not passed on."""
    assert event_allowed(event, joined) is relayed
