"""The lab proxy (``portal.lab_proxy``, ``portal.lab_consumers``) in front of a real relay and
a real JupyterLab: HTTP through the async view, WebSockets through the real ASGI
application, 404 for anyone who may not open the session, the token never shown, cross-site
writes refused, bodies bounded, and the agent's activity reports landing on the session."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.testing import ApplicationCommunicator
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client, override_settings
from django.utils import timezone
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)

from control.reports import handle_report
from inventory.models import Gpu
from inventory.services import do_load_topology
from jobs.agent_commands import runtime_job_name
from jobs.choices import JobKind, Launcher
from jobs.models import Job, JobGpu
from portal.asgi import application
from tenancy.models import Tenant
from workers.agent.lab_relay import LabRelay
from workers.lab_protocol import lab_base_url
from workers.protocol import LabActivity
from workers.tests.test_lab_relay import running_lab

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(180)]
DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def a_session(tenant: Tenant, user: Any) -> Job:
    """A running session of ``user`` in ``tenant`` on GPU 2 (its server's node)."""
    do_load_topology(DEMO)
    job = Job.objects.create(
        tenant=tenant, submitter=user, name="lab", gpus=1, min_gpus=1, max_gpus=1,
        batch_size=1, submitted_at=timezone.now(), kind=JobKind.SESSION,
        launcher=Launcher.SESSION, idle_timeout_s=600, state="running",
        started_at=timezone.now(),
    )  # fmt: skip
    JobGpu.objects.create(job=job, gpu=Gpu.objects.get(index=2), rank=0)
    return job


@pytest.fixture
def served(make_tenant: Callable[..., Tenant], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A session with its lab running and relayed, its owner and a stranger."""
    tenant, other = make_tenant("lab"), make_tenant("other")
    owner = get_user_model().objects.get(username="lab-owner")
    stranger = get_user_model().objects.get(username="other-owner")
    job = a_session(tenant, owner)
    node = Gpu.objects.select_related("server").get(index=2).server.node
    client = redis.Redis.from_url(settings.REDIS_URL)
    with running_lab(tmp_path, lab_base_url(job.pk)) as token:
        relay = LabRelay(
            client, node=node, job=runtime_job_name(job.pk), job_dir=tmp_path, worker_id="w0",
            token=token, base_url=lab_base_url(job.pk), activity_every_s=3600,
        )  # fmt: skip
        relay.start()
        try:
            yield {"job": job, "owner": owner, "stranger": stranger, "token": token,
                   "home": tmp_path / "scratch" / "w0", "node": node, "other": other}  # fmt: skip
        finally:
            relay.stop()
            client.close()


async def body_of(response: Any) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join([piece async for piece in response.streaming_content])
    return bytes(response.content)


def test_the_owner_gets_the_lab_and_everyone_else_a_404(served: dict[str, Any]) -> None:
    job = served["job"]
    base = lab_base_url(job.pk)

    async def scenario() -> None:
        owner = AsyncClient()
        await owner.aforce_login(served["owner"])
        page = await owner.get(f"{base}lab")
        text = await body_of(page)
        assert page.status_code == 200 and b"jupyter-config-data" in text
        assert served["token"].encode() not in text
        assert "Set-Cookie" not in page.headers or "_xsrf" not in page.headers["Set-Cookie"]
        await Job.objects.filter(pk=job.pk).aupdate(last_activity_at=None)
        listing = await owner.get(f"{base}api/contents")
        assert listing.status_code == 200
        assert (await Job.objects.aget(pk=job.pk)).last_activity_at is not None  # noted
        assert json.loads(await body_of(listing))["type"] == "directory"
        stranger = AsyncClient()
        await stranger.aforce_login(served["stranger"])
        refused = await stranger.get(f"{base}api/contents")
        assert refused.status_code == 404
        assert (await AsyncClient().get(f"{base}api/contents")).status_code == 302
        # A session that does not run has no lab either.
        await Job.objects.filter(pk=job.pk).aupdate(state="completed")
        assert (await owner.get(f"{base}api/contents")).status_code == 404

    asyncio.run(scenario())


def test_writes_come_only_from_the_portals_own_pages_and_bodies_are_bounded(
    served: dict[str, Any],
) -> None:
    base = lab_base_url(served["job"].pk)
    note = json.dumps({"type": "file", "format": "text", "content": "kept"})

    async def scenario() -> None:
        owner = AsyncClient()
        await owner.aforce_login(served["owner"])
        put = f"{base}api/contents/note.txt"
        cross = await owner.put(put, note, content_type="application/json",
                                headers={"Origin": "http://evil.example"})  # fmt: skip
        assert cross.status_code == 403
        assert not (served["home"] / "note.txt").exists()
        ours = await owner.put(put, note, content_type="application/json",
                               headers={"Origin": "http://testserver"})  # fmt: skip
        assert ours.status_code == 201, await body_of(ours)
        assert (served["home"] / "note.txt").read_text() == "kept"
        with override_settings(MAX_REQUEST_BODY_BYTES=100):
            big = await owner.put(put, "x" * 200, content_type="application/json",
                                  headers={"Origin": "http://testserver"})  # fmt: skip
        assert big.status_code == 413
        assert (served["home"] / "note.txt").read_text() == "kept"

    asyncio.run(scenario())


def cookie_of(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def test_a_kernel_runs_a_cell_through_the_proxied_websocket(served: dict[str, Any]) -> None:
    job = served["job"]
    base = lab_base_url(job.pk)
    owner_cookie = cookie_of(served["owner"])
    stranger_cookie = cookie_of(served["stranger"])

    def socket(path: str, cookie: str, *protocols: str) -> WebsocketCommunicator:
        headers = [
            (b"origin", b"http://testserver"),
            (b"host", b"testserver"),
            (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
        ]
        return WebsocketCommunicator(
            application, path, headers=headers, subprotocols=list(protocols) or None
        )

    async def scenario() -> None:
        owner = AsyncClient()
        await owner.aforce_login(served["owner"])
        started = await owner.post(f"{base}api/kernels", "{}", content_type="application/json",
                                   headers={"Origin": "http://testserver"})  # fmt: skip
        assert started.status_code == 201
        kernel = json.loads(await body_of(started))["id"]
        path = f"{base}api/kernels/{kernel}/channels"
        refused = socket(path, stranger_cookie)
        connected, code = await refused.connect(timeout=10)
        assert not connected and code == 4404
        # JupyterLab asks for the v1 framing: Jupyter's choice comes back through the relay.
        v1 = socket(path, owner_cookie, "v1.kernel.websocket.jupyter.org")
        connected, chosen = await v1.connect(timeout=30)
        assert connected and chosen == "v1.kernel.websocket.jupyter.org"
        header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "t",
                  "session": uuid.uuid4().hex, "version": "5.3", "date": ""}  # fmt: skip
        content = {"code": "print('binary', 6 * 7)", "silent": False, "store_history": False,
                   "user_expressions": {}, "allow_stdin": False}  # fmt: skip
        parts = [json.dumps(x).encode() for x in (header, {}, {}, content)]
        await v1.send_to(bytes_data=serialize_msg_to_ws_v1(parts, "shell"))  # type: ignore[no-untyped-call]
        seen = ""
        while "binary 42" not in seen:
            frame = await v1.receive_output(timeout=60)
            assert frame["type"] == "websocket.send", frame
            channel, msg_list = deserialize_msg_from_ws_v1(frame["bytes"])  # type: ignore[no-untyped-call]
            if channel == "iopub" and json.loads(msg_list[0])["msg_type"] == "stream":
                seen += json.loads(msg_list[3])["text"]
        await v1.disconnect()
        # The legacy JSON framing (no subprotocol) is easy to speak here: a cell runs.
        comm = socket(path, owner_cookie)
        connected, _ = await comm.connect(timeout=30)
        assert connected
        request = {
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request",
                       "username": "t", "session": uuid.uuid4().hex, "version": "5.3",
                       "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": "print('through the portal', 6 * 7)", "silent": False,
                        "store_history": False, "user_expressions": {}, "allow_stdin": False},
        }  # fmt: skip
        await comm.send_to(text_data=json.dumps(request))
        text = ""
        while "through the portal 42" not in text:
            message = await comm.receive_from(timeout=60)
            data = json.loads(message)
            if data.get("msg_type") == "stream":
                text += data["content"]["text"]
        await comm.disconnect()
        stopped = await owner.delete(f"{base}api/kernels/{kernel}",
                                     headers={"Origin": "http://testserver"})  # fmt: skip
        assert stopped.status_code == 204

    asyncio.run(scenario())


def test_the_agents_activity_report_moves_the_sessions_last_activity(
    served: dict[str, Any],
) -> None:
    job = served["job"]
    Job.objects.filter(pk=job.pk).update(last_activity_at=None)
    at = timezone.now().timestamp()
    report = LabActivity(
        node=served["node"], job=runtime_job_name(job.pk), last_activity=at - 100,
        connections=0, kernels=1, at=at,
    )  # fmt: skip
    assert handle_report(report.to_dict()) == "lab activity"
    job.refresh_from_db()
    assert job.last_activity_at is not None
    assert abs(job.last_activity_at.timestamp() - (at - 100)) < 1
    # A connected client counts as activity now; a clock ahead counts as now, no later.
    ahead = LabActivity(
        node=served["node"], job=runtime_job_name(job.pk), last_activity=at + 10**6,
        connections=1, kernels=0, at=at + 10**6,
    )  # fmt: skip
    handle_report(ahead.to_dict())
    job.refresh_from_db()
    assert job.last_activity_at <= timezone.now()


def test_a_lab_on_its_own_host_serves_its_owner_by_the_lab_cookie_alone(
    served: dict[str, Any],
) -> None:
    """``LAB_HOST_TEMPLATE`` set: the lab answers on ``lab-<id>.localhost`` to the browser its
    ticket signed in, over HTTP and WebSocket (through the whole ASGI application); the
    portal's cookie opens nothing there, and the portal's host and sockets serve no lab
    (portal.lab_origin)."""
    job = served["job"]
    base = lab_base_url(job.pk)
    host = f"lab-{job.pk}.localhost"
    portal_cookie = f"{settings.SESSION_COOKIE_NAME}={cookie_of(served['owner'])}"

    async def http(method: str, path: str, cookies: str, origin: str = "") -> dict[str, Any]:
        headers = [(b"host", host.encode()), (b"cookie", cookies.encode())]
        if origin:
            headers.append((b"origin", origin.encode()))
        body = b"{}" if method == "POST" else b""
        if body:
            headers.append((b"content-type", b"application/json"))
        target, _, query = path.partition("?")
        scope = {"type": "http", "http_version": "1.1", "method": method, "scheme": "http",
                 "path": target, "query_string": query.encode(), "headers": headers}  # fmt: skip
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": body})
        start = await comm.receive_output(60)
        pieces = []
        while True:
            message = await comm.receive_output(60)
            pieces.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        head = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return {"status": start["status"], "head": head, "body": b"".join(pieces)}

    def socket(path: str, cookies: str, on: str = host) -> WebsocketCommunicator:
        headers = [(b"origin", f"http://{on}".encode()), (b"host", on.encode()),
                   (b"cookie", cookies.encode())]  # fmt: skip
        return WebsocketCommunicator(application, path, headers=headers)

    async def scenario() -> None:
        portal = AsyncClient()
        await portal.aforce_login(served["owner"])
        handed = await portal.get(f"/sessions/{job.pk}/lab-open/")
        assert handed.status_code == 302
        link = handed["Location"]
        assert link.startswith(f"http://{host}{base}?lab_ticket=")
        signed = await http("GET", link.removeprefix(f"http://{host}"), "")
        assert signed["status"] == 302 and signed["head"]["location"] == base
        lab_cookie = signed["head"]["set-cookie"].split(";")[0]
        assert lab_cookie.startswith(f"lab_{job.pk}=")
        page = await http("GET", f"{base}lab", lab_cookie)
        assert page["status"] == 200 and b"jupyter-config-data" in page["body"]
        assert (await http("GET", f"{base}lab", portal_cookie))["status"] == 403
        started = await http("POST", f"{base}api/kernels", lab_cookie, f"http://{host}")
        assert started["status"] == 201, started["body"]
        kernel = json.loads(started["body"])["id"]
        # The portal's pages may not write to the lab: another origin now.
        cross = await http("POST", f"{base}api/kernels", lab_cookie, "http://testserver")
        assert cross["status"] == 403
        path = f"{base}api/kernels/{kernel}/channels"
        comm = socket(path, lab_cookie)
        connected, _ = await comm.connect(timeout=30)
        assert connected
        await comm.disconnect()
        # The portal's cookie on the lab host, the lab's socket on the portal's host, the
        # portal's live socket on the lab host, another lab's host: refused.
        assert (await socket(path, portal_cookie).connect(timeout=10)) == (False, 4401)
        both = f"{portal_cookie}; {lab_cookie}"
        assert (await socket(path, both, on="testserver").connect(timeout=10))[0] is False
        assert (await socket("/ws/live/", both).connect(timeout=10))[0] is False
        other = socket(path, lab_cookie, on=f"lab-{job.pk + 1}.localhost")
        assert (await other.connect(timeout=10))[0] is False
        stopped = await http("DELETE", f"{base}api/kernels/{kernel}", lab_cookie, f"http://{host}")
        assert stopped["status"] == 204

    with override_settings(
        LAB_HOST_TEMPLATE="lab-{id}.localhost",
        PORTAL_HOSTS=["testserver"],
        ALLOWED_HOSTS=["testserver", ".localhost"],
    ):
        asyncio.run(scenario())
