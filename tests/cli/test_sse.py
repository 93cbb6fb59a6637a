"""The Server-Sent Events parser, on the stream the logs endpoint writes."""

from __future__ import annotations

from portalctl.sse import Event, parse_events


def test_events_comments_and_the_end() -> None:
    stream = (
        'id: 3:0\ndata: {"text": "a"}\n\n'
        ": heartbeat\n\n"
        "id: 3:1\r\ndata: first\r\ndata: second\r\n\r\n"
        'event: end\ndata: {"cursor": "3:1"}\n\n'
    )
    assert list(parse_events(stream.splitlines(keepends=True))) == [
        Event(event="message", data='{"text": "a"}', id="3:0"),
        Event(event="message", data="first\nsecond", id="3:1"),
        Event(event="end", data='{"cursor": "3:1"}', id="3:1"),
    ]


def test_a_field_without_a_space_and_a_cut_stream() -> None:
    assert list(parse_events(["data:x", "", "event: error", "data: {}"])) == [
        Event(event="message", data="x", id=None),
        Event(event="error", data="{}", id=None),
    ]


def test_unknown_fields_are_ignored() -> None:
    assert list(parse_events(["retry: 1000", "foo: bar", ""])) == []
