"""The agent's tail of torchrun metrics files: real files, the real Redis, a manual clock.

The file is the tenant's: each hostile shape of it (a huge line, NaN, a
symlink to /etc/passwd, a FIFO, a hard link, lines that are not JSON, a
flood) is refused, counted once in an ``events_dropped`` report, and never
raised out of the agent's pass.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from workers.agent.log_shipper import LogOffsets
from workers.agent.metrics_file import MAX_LINE_BYTES
from workers.agent.metrics_tail import BURST_LINES, MAX_READ_BYTES, MetricsFileTail
from workers.clock import ManualClock
from workers.protocol import EventsDropped, Metrics, Report


@dataclass(frozen=True)
class Worker:
    job: str
    worker_id: str
    log_path: str = ""
    launcher: str | None = "torchrun"


@pytest.fixture
def offsets() -> Iterator[LogOffsets]:
    client = redis.Redis.from_url(str(settings.REDIS_URL), decode_responses=True)
    node = f"test-{uuid.uuid4().hex[:8]}"
    yield LogOffsets(client, node, "metrics")
    client.delete(f"agent:{node}:metrics")


class Sent:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        return [
            (p.step, p.values) for r in self.reports if isinstance(r, Metrics) for p in r.points
        ]

    def dropped(self) -> list[EventsDropped]:
        return [r for r in self.reports if isinstance(r, EventsDropped)]


class Setup:
    """A worker's scratch folder, its metrics file, and a tail reading it."""

    def __init__(self, tmp_path: Path, offsets: LogOffsets) -> None:
        self.folder = tmp_path / "scratch" / "w0"
        self.folder.mkdir(parents=True)
        self.path = self.folder / "metrics.jsonl"
        self.worker = Worker(job="job-1", worker_id="w0")
        self.clock = ManualClock()
        self.sent = Sent()
        self.tail = MetricsFileTail("gpu-1", offsets, self.sent, self.clock, lambda _: self.path)

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as handle:
            handle.write(data)

    def step(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        self.tail.tail([self.worker])


@pytest.fixture
def setup(tmp_path: Path, offsets: LogOffsets) -> Setup:
    return Setup(tmp_path, offsets)


def test_points_become_one_metrics_report_a_second_from_the_saved_offset(
    setup: Setup, offsets: LogOffsets
) -> None:
    setup.append(b'{"step": 1, "loss": 0.9}\n{"step": 2, "loss": 0.8, "acc": 0.5}\n{"step": 3')
    setup.step()
    assert setup.sent.metrics() == [(1, {"loss": 0.9}), (2, {"loss": 0.8, "acc": 0.5})]
    [report] = setup.sent.reports
    assert isinstance(report, Metrics) and report.event_id.startswith("metrics-file-w0-")
    setup.append(b', "loss": 0.7}\n')
    setup.tail.tail([setup.worker])  # within the second: not read again
    assert len(setup.sent.reports) == 1
    setup.step()
    assert setup.sent.metrics()[-1] == (3, {"loss": 0.7})
    # A restarted agent (a new tail, same Redis) goes on from the saved offset.
    again = Sent()
    fresh = MetricsFileTail("gpu-1", offsets, again, setup.clock, lambda _: setup.path)
    setup.append(b'{"step": 4, "loss": 0.6}\n')
    fresh.tail([setup.worker])
    assert again.metrics() == [(4, {"loss": 0.6})]


def test_a_last_line_without_newline_counts_when_the_worker_exits(setup: Setup) -> None:
    setup.append(b'{"step": 7, "loss": 0.1}')
    setup.step()
    assert setup.sent.metrics() == []
    setup.tail.flush(setup.worker)
    assert setup.sent.metrics() == [(7, {"loss": 0.1})]


def test_only_torchrun_workers_are_tailed(setup: Setup) -> None:
    setup.append(b'{"step": 1, "loss": 0.9}\n')
    setup.tail.tail([Worker(job="job-1", worker_id="w0", launcher="edl")])
    assert setup.sent.reports == []


def test_nan_and_non_json_lines_are_counted_and_reported_once(setup: Setup) -> None:
    setup.append(
        b'{"step": 1, "loss": NaN}\nnot json at all\n{"step": 2, "loss": 0.5}\n'
        b'{"step": 3, "loss": Infinity}\n'
    )
    setup.step()
    assert setup.sent.metrics() == [(2, {"loss": 0.5})]
    [dropped] = setup.sent.dropped()
    assert dropped.count == 3
    assert "METRICS_FILE line at byte 0" in dropped.reason and "NaN" in dropped.reason
    setup.append(b"more garbage\n")
    setup.step()  # within DROPPED_REPORT_EVERY_S: counted, not yet reported
    assert len(setup.sent.dropped()) == 1
    setup.tail.flush(setup.worker)  # the worker's exit reports the rest
    assert [d.count for d in setup.sent.dropped()] == [3, 1]


def test_a_huge_line_is_skipped_without_holding_it(setup: Setup) -> None:
    setup.append(b'{"step": 1, "loss": ' + b"1" * (MAX_READ_BYTES * 3) + b"}\n")
    setup.append(b'{"step": 2, "loss": 0.5}\n')
    for _ in range(4):
        setup.step()
    assert setup.sent.metrics() == [(2, {"loss": 0.5})]
    setup.tail.flush(setup.worker)
    [dropped] = setup.sent.dropped()
    assert dropped.count == 1 and "longer than the limit" in dropped.reason
    assert MAX_LINE_BYTES < MAX_READ_BYTES


def test_a_symlink_to_etc_passwd_is_refused_never_read(setup: Setup) -> None:
    setup.path.symlink_to("/etc/passwd")
    setup.step()
    setup.step()
    setup.tail.flush(setup.worker)
    assert setup.sent.metrics() == []
    [dropped] = setup.sent.dropped()
    assert dropped.count == 1 and "symbolic link" in dropped.reason
    assert "root" not in repr(setup.sent.reports)


def test_a_fifo_is_refused_without_blocking_the_agent(setup: Setup) -> None:
    os.mkfifo(setup.path)
    done = threading.Event()

    def one_pass() -> None:
        setup.step()
        setup.tail.flush(setup.worker)
        done.set()

    threading.Thread(target=one_pass, daemon=True).start()
    assert done.wait(timeout=5), "the tail blocked on a FIFO"
    [dropped] = setup.sent.dropped()
    assert "not a file" in dropped.reason


def test_a_hard_link_and_a_folder_are_refused(setup: Setup, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.write_bytes(b'{"step": 1, "loss": 0.5}\n')
    os.link(other, setup.path)
    setup.step()
    assert setup.sent.metrics() == []
    setup.path.unlink()
    setup.path.mkdir()
    setup.step()
    setup.tail.flush(setup.worker)
    first, second = setup.sent.dropped()
    assert (first.count, second.count) == (1, 1)
    assert "other links" in first.reason and "not a file" in second.reason


def test_a_flood_is_held_to_the_rate_and_the_rest_counted(setup: Setup) -> None:
    lines = b"".join(b'{"step": %d, "loss": 0.5}\n' % i for i in range(1000))
    setup.append(lines)
    setup.step()
    points = setup.sent.metrics()
    assert len(points) == int(BURST_LINES)
    setup.tail.flush(setup.worker)
    assert sum(d.count for d in setup.sent.dropped()) + len(setup.sent.metrics()) == 1000
    assert "over the rate" in setup.sent.dropped()[0].reason


def test_a_file_created_again_is_read_from_its_start(setup: Setup) -> None:
    setup.append(b'{"step": 1, "loss": 0.9}\n{"step": 2, "loss": 0.8}\n')
    setup.step()
    setup.path.unlink()
    setup.append(b'{"step": 1, "loss": 0.3}\n')
    setup.step()
    assert setup.sent.metrics()[-1] == (1, {"loss": 0.3})


def test_redis_away_never_raises_out_of_the_agents_pass(tmp_path: Path) -> None:
    away = LogOffsets(redis.Redis(port=1, socket_connect_timeout=0.2), "gpu-1", "metrics")
    sent = Sent()
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 0.5}\n')
    tail = MetricsFileTail("gpu-1", away, sent, ManualClock(), lambda _: path)
    worker = Worker(job="job-1", worker_id="w0")
    tail.tail([worker])
    tail.flush(worker)
    assert tail.files == {}  # forgotten all the same


def test_a_unix_socket_in_place_of_the_file_is_refused(setup: Setup) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(setup.path))
        setup.step()
        setup.tail.flush(setup.worker)
    [dropped] = setup.sent.dropped()
    assert "not a file" in dropped.reason
