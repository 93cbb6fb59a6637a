"""GET /api/v1/jobs/{id}/logs/: lines, cursors, filters, tenancy, SSE; the job page's log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from rest_framework.test import APIClient

from control.reports import handle_report
from control.tick import run_tick
from devtools.job_steps import move
from inventory.models import Server
from jobs.api.logs import follow_events
from jobs.logs.store import LogLine
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tests.jobs.control_helpers import demo_cluster, drain_all
from workers.protocol import LogLines


def submit(user: Any, tenant: Any, gpus: int = 1) -> Job:
    data = {"name": "logs", "workload": "mlp-digits", "gpus": gpus}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def output(job: Job, offset: int, text: str, worker: str = "w0", **fields: Any) -> str:
    report = LogLines(
        node=fields.pop("node", "node-0"),
        job=f"job-{job.pk}",
        worker_id=worker,
        log_id=fields.pop("log_id", f"node-0-1-{worker}"),
        offset=offset,
        text=text,
        **fields,
    )
    return handle_report(report.to_dict())


def numbered(job: Job, count: int, worker: str = "w0", start: int = 0) -> None:
    text = "".join(f"{worker} line {i}\n" for i in range(start, start + count))
    offset = sum(len(f"{worker} line {i}\n") for i in range(start))
    output(job, offset, text, worker)


@pytest.fixture
def job(alice: Any, acme: Any) -> Job:
    return submit(alice, acme)


def logs(client: APIClient, job: Job, **params: Any) -> Any:
    return client.get(f"/api/v1/jobs/{job.pk}/logs/", params)


@pytest.mark.django_db
def test_tail_since_and_worker(
    job: Job, alice: Any, token_client: Callable[[Any], APIClient]
) -> None:
    numbered(job, 30, "w0")
    numbered(job, 5, "w1")
    client = token_client(alice)
    page = logs(client, job).json()
    assert [line["text"] for line in page["lines"]][:2] == ["w0 line 0", "w0 line 1"]
    assert len(page["lines"]) == 35 and page["done"] is False
    assert set(page["lines"][0]) == {"cursor", "worker", "rank", "generation", "node", "text"}
    assert page["cursor"] == page["lines"][-1]["cursor"]

    tail = logs(client, job, tail=3).json()["lines"]
    assert [line["text"] for line in tail] == ["w1 line 2", "w1 line 3", "w1 line 4"]
    only = logs(client, job, worker="w0", tail=2).json()["lines"]
    assert [line["text"] for line in only] == ["w0 line 28", "w0 line 29"]

    # Paging forward with since: nothing skipped, nothing twice.
    seen: list[str] = []
    cursor = "0-0"
    for _ in range(10):
        step = logs(client, job, since=cursor, tail=7).json()
        seen += [line["text"] for line in step["lines"]]
        cursor = step["cursor"]
        if not step["lines"]:
            break
    assert seen == [line["text"] for line in page["lines"]]
    numbered(job, 2, "w0", start=30)
    fresh = logs(client, job, since=cursor).json()
    assert [line["text"] for line in fresh["lines"]] == ["w0 line 30", "w0 line 31"]


@pytest.mark.django_db
def test_done_when_the_job_is_over(job: Job, alice: Any, token_client: Any) -> None:
    numbered(job, 3)
    do_cancel_job(user=alice, job_id=job.pk, reason="enough")
    client = token_client(alice)
    assert logs(client, job).json()["done"] is True
    assert logs(client, job, since="0-0", tail=2).json()["done"] is False  # more to read
    assert logs(client, job, since="0-0", tail=3).json()["done"] is True


@pytest.mark.django_db
def test_another_tenants_job_is_404(job: Job, bob: Any, token_client: Any) -> None:
    numbered(job, 3)
    response = logs(token_client(bob), job)
    assert response.status_code == 404
    assert "line" not in response.content.decode()
    assert logs(APIClient(), job).status_code in (401, 403)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"tail": "many"}, "tail"),
        ({"tail": "10001"}, "tail"),
        ({"tail": "-1"}, "tail"),
        ({"since": "yesterday"}, "since"),
        ({"since": "1-2-3"}, "since"),
        ({"follow": "maybe"}, "follow"),
    ],
)
def test_bad_parameters_are_400_naming_them(
    job: Job, alice: Any, token_client: Any, params: dict[str, str], field: str
) -> None:
    response = logs(token_client(alice), job, **params)
    assert response.status_code == 400
    body = response.json()
    assert field in body["errors"] and body["message"].startswith(field)


@pytest.mark.django_db(transaction=True)  # the stream polls through database_sync_to_async
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_follow_streams_the_lines_then_end(job: Job, alice: Any, token_client: Any) -> None:
    numbered(job, 4)
    move(job_id=job.pk, to_state="cancelled", reason="done")
    response = logs(token_client(alice), job, follow=1, tail=2)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    body = b"".join(response).decode()  # the sync client runs the async stream
    events = [block for block in body.split("\n\n") if block]
    data = [json.loads(e.split("data: ")[1]) for e in events[:2]]
    assert [(d["text"], d["worker"], d["node"]) for d in data] == [
        ("w0 line 2", "w0", "node-0"),
        ("w0 line 3", "w0", "node-0"),
    ]
    assert [e.split("\n")[0] for e in events[:2]] == [f"id: {d['cursor']}" for d in data]
    assert events[-1].startswith("event: end\n")
    # An EventSource asks for text/event-stream; errors reach it as an event too.
    client = token_client(alice)
    bad = client.get(
        f"/api/v1/jobs/{job.pk}/logs/?follow=1&tail=x", HTTP_ACCEPT="text/event-stream"
    )
    assert bad.status_code == 400 and b"event: error" in bad.content


@pytest.mark.django_db(transaction=True)
def test_follow_under_asgi_streams_live_and_stops_when_the_client_goes(
    job: Job, alice: Any
) -> None:
    """The real ASGI application (as daphne runs it): events arrive while the job runs."""
    from portal.asgi import application

    numbered(job, 2)
    client = Client()
    client.force_login(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/api/v1/jobs/{job.pk}/logs/",
        "raw_path": f"/api/v1/jobs/{job.pk}/logs/".encode(),
        "query_string": b"follow=1",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"cookie", cookie),
            (b"accept", b"text/event-stream"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }

    async def scenario() -> tuple[int, str]:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": b"", "more_body": False})
        sent: list[dict[str, Any]] = []
        body = ""

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        task = asyncio.create_task(application(scope, inbox.get, send))
        for _ in range(100):  # the first two lines
            await asyncio.sleep(0.05)
            body = "".join(m.get("body", b"").decode() for m in sent)
            if body.count("data: ") >= 2:
                break
        await database_sync_to_async(numbered)(job, 1, "w0", 2)  # a new line, while following
        for _ in range(100):
            await asyncio.sleep(0.05)
            body = "".join(m.get("body", b"").decode() for m in sent)
            if "w0 line 2" in body:
                break
        await inbox.put({"type": "http.disconnect"})
        await asyncio.wait_for(task, timeout=5)  # the disconnect ended the stream
        return sent[0]["status"], body

    status, body = asyncio.run(scenario())
    assert status == 200
    assert body.count("data: ") == 3 and "w0 line 2" in body
    assert "event: end" not in body  # the job still runs


def test_follow_events_polls_beats_and_ends() -> None:
    def line(cursor: str) -> LogLine:
        return LogLine(cursor=cursor, worker="w0", rank=0, generation=1, node="n", text=cursor)

    answers = [([line("5-0"), line("5-1")], False), ([], False), ([], False), ([line("6-0")], True)]
    asked: list[tuple[int, int]] = []

    async def poll(cursor: tuple[int, int]) -> tuple[list[LogLine], bool]:
        asked.append(cursor)
        return answers.pop(0)

    ticks = iter(range(0, 1000, 10))  # every call to the clock: 10 s later

    async def collect() -> list[str]:
        stream = follow_events(
            [line("4-2")], (4, 2), poll, poll_seconds=0, heartbeat_seconds=15,
            monotonic=lambda: float(next(ticks)),
        )  # fmt: skip
        return [event async for event in stream]

    # Its own thread: a browser test run before may leave this thread's event loop set.
    with ThreadPoolExecutor(1) as pool:
        events = pool.submit(asyncio.run, collect()).result()
    assert asked == [(4, 2), (5, 1), (5, 1), (5, 1)]
    kinds = [e.split("\n")[0].split(":")[0] for e in events]
    assert kinds == ["id", "id", "id", "", "id", "event"]
    assert events[3] == ": heartbeat\n\n"
    assert events[-1] == 'event: end\ndata: {"cursor": "6-0"}\n\n'


@pytest.mark.django_db
def test_the_job_page_shows_the_log_as_text(job: Job, alice: Any) -> None:
    output(job, 0, "plain\n<script>alert('x')</script>\n")
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "[w0] &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script>alert(" not in page
    assert 'data-cursor="' in page and '<option value="w0">w0</option>' in page


@pytest.mark.django_db(transaction=True)
def test_ranks_from_the_portal_and_logs_outlive_the_node(
    alice: Any, acme: Any, token_client: Any
) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    drain_all(nodes)
    slots = list(JobGpu.objects.filter(job=job).select_related("gpu__server"))
    assert len(slots) == 2
    for slot in slots:
        worker = f"w{slot.gpu.index}"
        output(job, 0, f"hello from {worker}\n", worker, node=slot.gpu.server.node)
    output(job, 0, "tagged\n", "w99", rank=7, generation=3)

    do_cancel_job(user=alice, job_id=job.pk, reason="done")
    drain_all(nodes)
    JobGpu.objects.filter(job=job).delete()  # nothing holds the servers any more
    Server.objects.all().delete()  # the nodes are gone, and their agents with them
    lines = logs(token_client(alice), job).json()["lines"]
    ranks = {line["worker"]: line["rank"] for line in lines}
    assert ranks == {
        **{f"w{slot.gpu.index}": slot.rank for slot in slots},
        "w99": 7,
    }
    assert [line["text"] for line in lines][-1] == "tagged"
    assert lines[-1]["generation"] == 3
