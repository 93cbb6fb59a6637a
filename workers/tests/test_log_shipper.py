"""The log shipper against the real Redis, with a manual clock and real files."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from workers.agent.log_shipper import (
    MAX_REPORT_BYTES,
    LogOffsets,
    LogShipper,
    cut,
)
from workers.clock import ManualClock
from workers.protocol import LogLines, Report

HEADER = b"--- 2026-12-01 00:00:00 python -m workers.elastic.worker --job j-1\n"


@dataclass(frozen=True)
class Worker:
    job: str
    worker_id: str
    log_path: str
    rank: int | None = None


@pytest.fixture
def offsets() -> Iterator[LogOffsets]:
    client = redis.Redis.from_url(str(settings.REDIS_URL), decode_responses=True)
    node = f"test-{uuid.uuid4().hex[:8]}"
    yield LogOffsets(client, node)
    client.delete(f"agent:{node}:logs")


class Shipped:
    def __init__(self) -> None:
        self.reports: list[LogLines] = []

    def __call__(self, report: Report) -> None:
        assert isinstance(report, LogLines)
        self.reports.append(report)

    def text(self) -> str:
        return "".join(r.text for r in self.reports)


def shipper(offsets: LogOffsets, clock: ManualClock) -> tuple[LogShipper, Shipped]:
    sent = Shipped()
    return LogShipper("gpu-1", offsets, sent, clock), sent


def worker(tmp_path: Path, body: bytes = b"", name: str = "w0") -> Worker:
    path = tmp_path / f"{name}.log"
    path.write_bytes(HEADER + body)
    return Worker(job="j-1", worker_id=name, log_path=str(path), rank=3)


def append(w: Worker, data: bytes) -> None:
    with open(w.log_path, "ab") as handle:
        handle.write(data)


def test_ships_whole_lines_with_offsets_tags_and_once_a_second(
    tmp_path: Path, offsets: LogOffsets
) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"step 1\nstep 2\npartial")
    logs.ship([w])
    [first] = sent.reports
    assert first.text == HEADER.decode() + "step 1\nstep 2\n"
    assert (first.offset, first.size, first.worker_id, first.rank) == (0, len(first.text), "w0", 3)
    assert first.log_id.startswith("gpu-1-")

    append(w, b" line\nstep 3\n")
    clock.advance(0.5)
    logs.ship([w])  # within the second: nothing
    assert len(sent.reports) == 1
    clock.advance(0.5)
    logs.ship([w])
    second = sent.reports[1]
    assert second.text == "partial line\nstep 3\n"
    assert second.offset == first.offset + first.byte_size
    assert second.log_id == first.log_id


def test_big_output_is_cut_into_bounded_reports_at_line_ends(
    tmp_path: Path, offsets: LogOffsets
) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    lines = b"".join(f"line {i:06d} ".encode() + b"x" * 90 + b"\n" for i in range(3000))
    w = worker(tmp_path, lines)
    logs.ship([w])
    assert len(sent.reports) > 1
    for report in sent.reports:
        assert report.byte_size <= MAX_REPORT_BYTES
        assert report.text.endswith("\n")
    assert sent.text().encode() == HEADER + lines
    ends = [r.offset + r.byte_size for r in sent.reports]
    assert [r.offset for r in sent.reports[1:]] == ends[:-1]


def test_a_very_long_line_is_cut_between_characters(tmp_path: Path, offsets: LogOffsets) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, "é".encode() * 70000 + b"\n")
    logs.ship([w])
    assert "\ufffd" not in sent.text()
    assert sent.text() == HEADER.decode() + "é" * 70000 + "\n"


def test_invalid_bytes_are_replaced_but_offsets_count_bytes(
    tmp_path: Path, offsets: LogOffsets
) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"bad \xff byte\n")
    logs.ship([w])
    append(w, b"next\n")
    clock.advance(1)
    logs.ship([w])
    first, second = sent.reports
    assert "\ufffd" in first.text
    assert first.size == len(HEADER) + len(b"bad \xff byte\n")
    assert second.offset == first.size and second.text == "next\n"


def test_a_partial_line_waits_then_goes_and_a_flush_sends_everything(
    tmp_path: Path, offsets: LogOffsets
) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"epoch 1 [=====")
    logs.ship([w])
    assert sent.text() == HEADER.decode()
    clock.advance(5)
    logs.ship([w])  # waited long enough
    assert sent.text() == HEADER.decode() + "epoch 1 [====="
    append(w, b"=] done")
    logs.flush(w)  # no waiting, no interval
    assert sent.text().endswith("=] done")


def test_restart_resumes_from_the_saved_offset(tmp_path: Path, offsets: LogOffsets) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"one\ntwo\n")
    logs.ship([w])
    append(w, b"three\n")  # written while no agent runs

    # A fresh agent process: no memory but what the node's Redis keeps.
    again, sent_again = shipper(LogOffsets(offsets.redis, offsets.key.split(":")[1]), clock)
    again.ship([w])
    assert sent_again.text() == "three\n"
    assert sent_again.reports[0].offset == sent.reports[0].size
    assert sent_again.reports[0].log_id == sent.reports[0].log_id
    assert sent.text() + sent_again.text() == Path(w.log_path).read_text()


def test_lost_offsets_resend_under_the_same_id(tmp_path: Path, offsets: LogOffsets) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"one\n")
    logs.ship([w])
    offsets.drop("j-1", "w0")
    again, sent_again = shipper(offsets, clock)
    again.ship([w])
    assert sent_again.reports[0].log_id == sent.reports[0].log_id  # the portal drops it
    assert sent_again.reports[0].offset == 0


def test_a_recreated_file_gets_a_new_id_and_starts_at_zero(
    tmp_path: Path, offsets: LogOffsets
) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"old run, a long line of output\n" * 4)
    logs.ship([w])
    keep = tmp_path / "keep"  # hold the old inode so the new file cannot reuse it
    Path(w.log_path).rename(keep)
    Path(w.log_path).write_bytes(b"--- 2026-12-01 00:00:09 python -m other\nnew\n")
    clock.advance(1)
    logs.ship([w])
    old, new = sent.reports
    assert new.log_id != old.log_id
    assert (new.offset, new.text) == (0, "--- 2026-12-01 00:00:09 python -m other\nnew\n")


def test_a_truncated_file_starts_over(tmp_path: Path, offsets: LogOffsets) -> None:
    clock = ManualClock()
    logs, sent = shipper(offsets, clock)
    w = worker(tmp_path, b"x" * 500 + b"\n")
    logs.ship([w])
    Path(w.log_path).write_bytes(b"fresh start, same inode\n")
    clock.advance(1)
    logs.ship([w])
    assert sent.reports[1].offset == 0
    assert sent.reports[1].log_id != sent.reports[0].log_id


def test_missing_file_sends_nothing(tmp_path: Path, offsets: LogOffsets) -> None:
    logs, sent = shipper(offsets, ManualClock())
    logs.ship([Worker(job="j-1", worker_id="w0", log_path=str(tmp_path / "none.log"))])
    logs.flush(Worker(job="j-1", worker_id="w0", log_path=str(tmp_path / "none.log")))
    assert sent.reports == []


@pytest.mark.parametrize(
    ("data", "at_eof", "final", "expected"),
    [
        (b"a\nb", True, False, 2),
        (b"a\nb", True, True, 3),
        (b"ab", True, False, 0),
        (b"x" * MAX_REPORT_BYTES, False, False, MAX_REPORT_BYTES),
        (b"x" * (MAX_REPORT_BYTES - 1) + b"\xc3", False, False, MAX_REPORT_BYTES - 1),
        (b"x" * (MAX_REPORT_BYTES - 2) + "é".encode(), False, False, MAX_REPORT_BYTES),
    ],
)
def test_cut(data: bytes, at_eof: bool, final: bool, expected: int) -> None:
    assert cut(data, at_eof=at_eof, final=final) == expected


def test_a_refused_report_is_sent_again(tmp_path: Path, offsets: LogOffsets) -> None:
    clock = ManualClock()
    refused: list[Report] = []

    def broker_down(report: Report) -> bool:
        refused.append(report)
        return False

    logs = LogShipper("gpu-1", offsets, broker_down, clock)
    w = worker(tmp_path, b"one\n")
    logs.ship([w])  # send_report said False: the broker is down
    sent = Shipped()
    clock.advance(1)
    LogShipper("gpu-1", offsets, sent, clock).ship([w])
    assert len(refused) == 1 and sent.text() == HEADER.decode() + "one\n"
