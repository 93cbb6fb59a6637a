"""Storing a job's output from log_lines reports: once, in order, capped, tagged."""

from __future__ import annotations

from typing import Any

import pytest

from control.reports import handle_report
from jobs.logs.store import lines_after, parse_cursor, tail_lines
from jobs.models import Job, LogChunk, LogStream
from jobs.services import check_job_spec, do_submit_job
from workers.protocol import LogLines


@pytest.fixture
def job(alice: Any, acme: Any) -> Job:
    spec = check_job_spec(tenant=acme, data={"name": "logs", "workload": "mlp-digits", "gpus": 1})
    return do_submit_job(user=alice, tenant=acme, spec=spec)


def output(job: Job, offset: int, text: str, **fields: Any) -> str:
    """Feed the control plane one log_lines report, as an agent sends it."""
    report = LogLines(
        node=fields.pop("node", "node-0"),
        job=f"job-{job.pk}",
        worker_id=fields.pop("worker_id", "w0"),
        log_id=fields.pop("log_id", "node-0-11-aa"),
        offset=offset,
        text=text,
        **fields,
    )
    return handle_report(report.to_dict())


def stored(job: Job) -> str:
    return "".join(LogChunk.objects.filter(job=job).order_by("id").values_list("text", flat=True))


@pytest.mark.django_db
def test_output_is_stored_in_order_and_read_back_as_lines(job: Job) -> None:
    assert output(job, 0, "one\ntwo\n") == "log"
    assert output(job, 8, "three\r\nfour") == "log"
    lines = tail_lines(job, count=10)
    assert [line.text for line in lines] == ["one", "two", "three", "four"]
    assert [line.worker for line in lines] == ["w0"] * 4
    assert tail_lines(job, count=2)[0].text == "three"
    assert [line.text for line in lines_after(job, parse_cursor(lines[1].cursor), limit=5)] == [
        "three",
        "four",
    ]


@pytest.mark.django_db
def test_replays_are_dropped_and_overlaps_trimmed(job: Job) -> None:
    assert output(job, 0, "0123456789") == "log"
    assert output(job, 0, "0123456789") == "duplicate"
    assert output(job, 5, "56789abcde") == "log"  # half new
    assert output(job, 2, "234") == "duplicate"
    assert stored(job) == "0123456789abcde"
    assert list(LogChunk.objects.filter(job=job).values_list("offset", "size")) == [
        (0, 10),
        (10, 5),
    ]


@pytest.mark.django_db
def test_out_of_order_reports_fill_their_gap_once(job: Job) -> None:
    assert output(job, 10, "klmno\n") == "log"  # arrived first
    assert output(job, 0, "abcdefghij") == "log"  # fills the gap
    assert output(job, 0, "abcdefghijklmno\n") == "duplicate"
    assert sorted(stored(job)) == sorted("abcdefghijklmno\n")
    stream = LogStream.objects.get(job=job)
    assert (stream.end, stream.gaps) == (16, [])


@pytest.mark.django_db
def test_streams_are_told_apart_by_node_and_log_id(job: Job) -> None:
    output(job, 0, "first file\n")
    output(job, 0, "recreated file\n", log_id="node-0-11-bb")
    output(job, 0, "other node\n", node="node-1", worker_id="w2")
    assert stored(job) == "first file\nrecreated file\nother node\n"
    assert [line.node for line in tail_lines(job, count=3)] == ["node-0", "node-0", "node-1"]
    assert [line.text for line in tail_lines(job, count=9, worker="w2")] == ["other node"]


@pytest.mark.django_db
def test_replaced_bytes_keep_offsets_right(job: Job) -> None:
    output(job, 0, "bad \ufffd byte\n", size=11)  # one invalid byte became U+FFFD
    assert output(job, 11, "next\n") == "log"
    assert output(job, 0, "bad \ufffd byte\n", size=11) == "duplicate"
    assert stored(job) == "bad \ufffd byte\nnext\n"


@pytest.mark.django_db
def test_cap_drops_the_oldest_output_and_leaves_a_marker(job: Job, settings: Any) -> None:
    settings.LOG_MAX_BYTES = 100
    for i in range(5):
        output(job, 30 * i, f"{i}" * 29 + "\n")
    lines = tail_lines(job, count=100)
    assert (
        lines[0].text.startswith("[… ") and "older output dropped (LOG_MAX_BYTES)" in lines[0].text
    )
    assert lines[0].worker == ""
    kept = [line.text for line in lines[1:]]
    assert kept == [str(i) * 29 for i in range(5)][-len(kept) :]
    dropped = int(lines[0].text.split()[1])
    assert dropped + 30 * len(kept) == 150
    assert sum(LogChunk.objects.filter(job=job).values_list("size", flat=True)) <= 100
    # Dropping again adds up in a single marker, still first.
    for i in range(5, 8):
        output(job, 30 * i, f"{i}" * 29 + "\n")
    lines = tail_lines(job, count=100)
    markers = [line for line in lines if not line.worker]
    assert markers == lines[:1]
    assert int(lines[0].text.split()[1]) + 30 * (len(lines) - 1) == 240
    assert lines[-1].text == "7" * 29
    # The stream still knows what it had: a replay of dropped output stays dropped.
    assert output(job, 0, "0" * 29 + "\n") == "duplicate"


@pytest.mark.django_db
def test_tags_come_from_the_report(job: Job) -> None:
    output(job, 0, "tagged\n", rank=3, generation=2)
    output(job, 7, "untagged\n")
    first, second = tail_lines(job, count=2)
    assert (first.rank, first.generation) == (3, 2)
    assert (second.rank, second.generation) == (None, None)  # w0 holds no GPU of the job


@pytest.mark.django_db
def test_unknown_job_and_bad_report() -> None:
    report = LogLines(node="n", job="job-999999", worker_id="w0", log_id="x", offset=0, text="a")
    assert handle_report(report.to_dict()) == "unknown job"
    bad = {**report.to_dict(), "offset": -1}
    assert handle_report(bad).startswith("invalid: log_lines.offset")


@pytest.mark.django_db
def test_new_lines_are_broadcast_to_the_job_page(job: Job, monkeypatch: Any) -> None:
    sent: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    monkeypatch.setattr(
        "jobs.logs.store.broadcast_on_commit",
        lambda groups, payload: sent.append((groups, payload)),
    )
    output(job, 0, "hello <script>alert(1)</script>\n")
    output(job, 0, "hello <script>alert(1)</script>\n")  # a replay broadcasts nothing
    [(groups, payload)] = sent
    assert groups == (f"job-{job.pk}",)  # the job page only: lines are not for dashboards
    assert payload["type"] == "job.log" and payload["job"] == job.pk
    assert payload["lines"][0]["text"] == "hello <script>alert(1)</script>"
    assert payload["lines"][0]["worker"] == "w0"
