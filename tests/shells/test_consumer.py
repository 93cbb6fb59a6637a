"""The shell's WebSocket through the real ASGI application (origin check, token auth, router),
real Redis streams and the database; the test plays the agent's part on the streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client, override_settings

from audit.models import AuditEntry
from inventory.models import Gpu
from inventory.services import do_load_topology
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_submit_job
from portal.asgi import application
from shells.models import Shell
from shells.streams import input_key, live_counts, output_key, parse_counts
from tenancy.models import Tenant
from tenancy.token_services import do_issue_token
from workers.protocol import shell_entries

pytestmark = pytest.mark.django_db(transaction=True)
DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def running(user: Any, tenant: Tenant, gpus: tuple[int, ...] = (2, 3)) -> Job:
    """A job of ``tenant`` that runs on ``gpus`` (node-1 for 2 and 3)."""
    do_load_topology(DEMO)
    spec = check_job_spec(tenant=tenant, data={"name": "j", "workload": "mlp-digits", "gpus": 2})
    job = do_submit_job(user=user, tenant=tenant, spec=spec)
    for rank, index in enumerate(gpus):
        JobGpu.objects.create(job=job, gpu=Gpu.objects.get(index=index), rank=rank)
    Job.objects.filter(pk=job.pk).update(state="running")
    return job


def socket(job_id: int, token: str | None, cookie: str | None = None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if token is not None:
        headers.append((b"authorization", f"Token {token}".encode()))
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/shell/", headers=headers)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def closed_with(comm: WebsocketCommunicator, timeout: float = 5) -> tuple[list[Any], int]:
    """The frames the server sent, then its close code."""
    frames: list[Any] = []
    while True:
        message = await comm.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return frames, int(message["code"])
        frames.append(message.get("bytes") or json.loads(message["text"]))


async def opened(comm: WebsocketCommunicator, **fields: Any) -> dict[str, Any]:
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "open", **fields})
    answer: dict[str, Any] = await comm.receive_json_from(timeout=5)
    assert answer["type"] == "opened", answer
    return answer


def raw() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def inputs(node: str, shell_id: str) -> list[dict[bytes, bytes]]:
    return [fields for _id, fields in shell_entries(raw().xread({input_key(node, shell_id): 0}))]


def test_a_shell_pumps_bytes_both_ways_and_records_its_exit_and_audit(
    alice: Any, acme: Tenant
) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        answer = await opened(comm, argv=["sh"], rows=30, cols=100)
        assert (answer["worker"], answer["node"]) == ("w2", "node-1")
        shell_id = answer["shell"]
        await comm.send_to(bytes_data=b"ls\n")
        await comm.send_json_to({"type": "resize", "rows": 40, "cols": 120})
        await comm.send_json_to({"type": "eof"})
        await asyncio.sleep(0.3)
        got = await sync_to_async(inputs)("node-1", shell_id)
        assert got == [{b"d": b"ls\n"}, {b"r": b"40 120"}, {b"e": b"1"}]
        out = output_key("node-1", shell_id)
        raw().xadd(out, {"d": b"hello\r\n"})
        raw().xadd(out, {"x": "3"})
        frames, code = await closed_with(comm)
        assert frames == [b"hello\r\n", {"type": "exit", "code": 3}] and code == 1000

    run(scenario)
    shell = Shell.objects.get()
    assert (shell.exit_code, shell.bytes_in, shell.bytes_out) == (3, 3, 7)
    assert shell.closed_at is not None and shell.user == alice and shell.argv == ["sh"]
    actions = list(AuditEntry.objects.filter(object_id=shell.id).values_list("action", flat=True))
    assert sorted(actions) == ["shell.close", "shell.open"]


def test_another_tenants_job_is_refused_exactly_like_a_missing_one(
    alice: Any, acme: Tenant, bob: Any
) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=bob)

    async def scenario() -> None:
        answers = []
        for job_id in (job.pk, job.pk + 1000):
            comm = socket(job_id, token)
            await comm.connect()
            await comm.send_json_to({"type": "open"})
            frames, code = await closed_with(comm)
            answers.append((frames[0]["status"], frames[0]["field"], code))
        assert answers[0] == answers[1] == (404, "job", 4404)

    run(scenario)
    assert not Shell.objects.exists()


@pytest.mark.parametrize(
    "first,status,field",
    [
        ("{not json", 400, "message"),
        (json.dumps({"type": "open", "worker": "w9"}), 400, "worker"),
        (json.dumps({"type": "open", "rows": 0}), 400, "rows"),
        (json.dumps({"type": "open", "argv": "sh"}), 400, "argv"),
        (json.dumps({"type": "shout"}), 400, "type"),
        (json.dumps({"type": "resize", "rows": 2, "cols": 2}), 400, "type"),
    ],
)
def test_a_bad_open_is_refused_naming_the_field_and_opens_nothing(
    alice: Any, acme: Tenant, first: str, status: int, field: str
) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        await comm.connect()
        await comm.send_to(text_data=first)
        frames, code = await closed_with(comm)
        assert (frames[0]["status"], frames[0]["field"], code) == (status, field, 4000 + status)

    run(scenario)
    assert not Shell.objects.exists() and not AuditEntry.objects.filter(action="shell.open")


def test_bad_frames_after_the_open_are_refused_and_forward_nothing(
    alice: Any, acme: Tenant
) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        shell_id = (await opened(comm))["shell"]
        refusals = []
        for frame in (
            {"bytes_data": b"x" * (settings.SHELL_MAX_FRAME_BYTES + 1)},
            {"text_data": "[1, 2"},
            {"text_data": "x" * 70_000},
            {"text_data": json.dumps({"type": "open"})},
            {"text_data": json.dumps({"type": "resize", "rows": 5000, "cols": 80})},
        ):
            await comm.send_to(**frame)
            answer = await comm.receive_json_from(timeout=5)
            refusals.append((answer["status"], answer["field"]))
        assert refusals == [
            (400, "data"), (400, "message"), (400, "message"), (400, "type"), (400, "rows"),
        ]  # fmt: skip
        await comm.send_to(bytes_data=b"ok\n")  # the shell goes on
        await asyncio.sleep(0.3)
        assert await sync_to_async(inputs)("node-1", shell_id) == [{b"d": b"ok\n"}]
        await comm.disconnect()

    run(scenario)
    shell = Shell.objects.get()
    assert shell.closed_at is not None and shell.close_reason == "the client left"
    assert {b"k": b"1"} in inputs("node-1", shell.id)  # the agent is told to end it


def test_tokens_and_job_states_that_may_not_open_a_shell(alice: Any, acme: Tenant) -> None:
    job = running(alice, acme)
    read_token = do_issue_token(user=alice, scope="read")
    write_token = do_issue_token(user=alice, name="w2")
    Job.objects.filter(pk=job.pk).update(state="completed")

    async def scenario() -> None:
        codes = []
        for token in (None, "not-a-token", read_token, write_token):
            comm = socket(job.pk, token)
            await comm.connect()
            await comm.send_json_to({"type": "open"})
            _frames, code = await closed_with(comm)
            codes.append(code)
        assert codes == [4401, 4401, 4403, 4409]

    run(scenario)
    assert not Shell.objects.exists()


@override_settings(SHELL_MAX_OPEN_PER_USER=1)
def test_a_user_has_a_bounded_number_of_open_shells(alice: Any, acme: Tenant) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        first = socket(job.pk, token)
        await opened(first)
        second = socket(job.pk, token)
        await second.connect()
        await second.send_json_to({"type": "open"})
        frames, code = await closed_with(second)
        assert (frames[0]["field"], code) == ("shells", 4429)
        await first.disconnect()

    run(scenario)
    assert Shell.objects.count() == 1


@override_settings(SHELL_IDLE_SECONDS=0.5)
def test_an_idle_shell_is_told_to_close(alice: Any, acme: Tenant) -> None:
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        shell_id = (await opened(comm))["shell"]
        raw().xadd(output_key("node-1", shell_id), {"d": b"$ "})
        assert await comm.receive_from(timeout=5) == b"$ "
        await asyncio.sleep(2.0)
        assert {b"k": b"1"} in await sync_to_async(inputs)("node-1", shell_id)
        raw().xadd(output_key("node-1", shell_id), {"x": "-9"})
        frames, _code = await closed_with(comm)
        assert frames[-1] == {"type": "exit", "code": -9, "reason": "idle"}

    run(scenario)
    assert Shell.objects.get().close_reason == "idle"


def test_a_signed_in_browser_session_opens_a_shell_too(alice: Any, acme: Tenant) -> None:
    job = running(alice, acme)
    browser = Client()
    browser.force_login(alice)
    cookie = str(browser.cookies["sessionid"].value)

    async def scenario() -> None:
        comm = socket(job.pk, None, cookie=cookie)
        answer = await opened(comm)
        assert answer["worker"] == "w2"
        await comm.disconnect()

    run(scenario)
    assert Shell.objects.get().user == alice


def test_a_shell_the_agent_never_opens_ends_and_stays_closed(
    alice: Any, acme: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No agent answers (it is down, or busy past the wait): the client is told, and the
    agent, should it open the shell later, finds the close first."""
    monkeypatch.setattr("shells.consumers.OPEN_WAIT_S", 0.5)
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        shell_id = (await opened(comm))["shell"]
        frames, code = await closed_with(comm)
        assert frames == [{"type": "exit", "code": None, "reason": "the agent did not answer"}]
        assert code == 1000
        assert {b"k": b"1"} in await sync_to_async(inputs)("node-1", shell_id)

    run(scenario)
    assert Shell.objects.get().close_reason == "the agent did not answer"


def test_an_open_shell_says_how_many_bytes_it_moved_while_it_runs(alice: Any, acme: Tenant) -> None:
    """The admins' page shows an open shell's bytes: its consumer writes its counts into
    the shell's alive key as they change (every couple of seconds), not only at the end."""
    job = running(alice, acme)
    token = do_issue_token(user=alice)

    async def scenario() -> None:
        comm = socket(job.pk, token)
        shell_id = (await opened(comm))["shell"]
        await comm.send_to(bytes_data=b"ls\n")
        raw().xadd(output_key("node-1", shell_id), {"d": b"hello"})
        assert await comm.receive_from(timeout=5) == b"hello"
        counts: dict[str, tuple[int, int]] = {}
        for _ in range(50):
            counts = await sync_to_async(live_counts)([shell_id])
            if counts.get(shell_id) == (3, 5):
                break
            await asyncio.sleep(0.1)
        assert counts == {shell_id: (3, 5)}
        await comm.disconnect()
        assert await sync_to_async(live_counts)([shell_id]) == {}  # no longer served

    run(scenario)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (b"3 5", (3, 5)),
        ("0 0", (0, 0)),
        (b"1", None),  # an older consumer's plain "1": served, but no counts
        (b"-3 5", None),
        (b"3 5 7", None),
        (b"3x 5", None),
        (b"9" * 21 + b" 1", None),
        (None, None),
    ],
)
def test_counts_are_read_strictly(value: bytes | str | None, parsed: Any) -> None:
    assert parse_counts(value) == parsed
