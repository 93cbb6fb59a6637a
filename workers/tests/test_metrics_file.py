"""The rules of a torchrun program's metrics file: cutting lines and parsing each (pure)."""

from __future__ import annotations

import pytest

from workers.agent.metrics_file import (
    MAX_LINE_BYTES,
    MetricLineRefused,
    parse_metric_line,
    scan,
)


def test_a_line_is_a_step_and_finite_metrics() -> None:
    point = parse_metric_line(b'{"step": 10, "loss": 0.5, "acc": 1}')
    assert point is not None
    assert (point.step, point.values) == (10, {"loss": 0.5, "acc": 1.0})
    assert parse_metric_line(b"   ") is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"step": 1, "loss": NaN}', "NaN is not a finite number"),
        (b'{"step": 1, "loss": Infinity}', "Infinity is not a finite number"),
        (b'{"step": 1, "loss": 1e999}', "finite"),
        (b'{"step": 1, "loss": ' + b"9" * 400 + b"}", "int too large"),
        (b'{"step": 1, "loss": "0.5"}', "must be a number"),
        (b'{"step": 1, "loss": true}', "must be a number"),
        (b'{"step": 1, "bad name!": 1}', "metric name"),
        (b'{"step": 1}', "at least one metric"),
        (b'{"step": -1, "loss": 1}', "step must be an integer"),
        (b'{"step": 1.5, "loss": 1}', "step must be an integer"),
        (b'{"step": 99999999999999999999, "loss": 1}', "step must be an integer"),
        (b'{"loss": 1}', "step must be an integer"),
        (b"step=1 loss=0.5", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 3000 + b"]" * 3000, "nests too deeply"),
    ],
)
def test_hostile_lines_are_refused_with_the_reason(line: bytes, reason: str) -> None:
    with pytest.raises(MetricLineRefused, match=reason):
        parse_metric_line(line)


def test_scan_cuts_whole_lines_and_leaves_a_partial_one_until_final() -> None:
    data = b'{"a": 1}\n{"b": 2}\n{"c"'
    found = scan(data, 100, skipping=False, final=False)
    assert [(line.offset, line.data) for line in found.lines] == [
        (100, b'{"a": 1}'),
        (109, b'{"b": 2}'),
    ]
    assert (found.consumed, found.skipping, found.overlong) == (18, False, ())
    last = scan(data[18:], 118, skipping=False, final=True)
    assert [(line.offset, line.data) for line in last.lines] == [(118, b'{"c"')]
    assert last.consumed == 4


def test_a_huge_line_is_skipped_to_its_newline_across_reads_and_counted_once() -> None:
    huge = b"x" * (MAX_LINE_BYTES * 3)
    first = scan(huge[: MAX_LINE_BYTES * 2], 0, skipping=False, final=False)
    assert (first.lines, first.overlong, first.skipping) == ((), (0,), True)
    assert first.consumed == MAX_LINE_BYTES * 2
    rest = huge[MAX_LINE_BYTES * 2 :] + b'\n{"step": 1, "a": 1}\n'
    second = scan(rest, first.consumed, skipping=True, final=False)
    assert second.overlong == ()
    assert [line.data for line in second.lines] == [b'{"step": 1, "a": 1}']
    assert not second.skipping


def test_a_line_of_exactly_the_limit_is_a_line() -> None:
    line = b"y" * MAX_LINE_BYTES
    found = scan(line + b"\n", 0, skipping=False, final=False)
    assert [x.data for x in found.lines] == [line]
    over = scan(line + b"z\n", 0, skipping=False, final=False)
    assert (over.lines, over.overlong, over.consumed) == ((), (0,), MAX_LINE_BYTES + 2)
