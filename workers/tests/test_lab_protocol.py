"""The lab's framing (``workers.lab_protocol``): bounded, checked, and what crosses it."""

from __future__ import annotations

import pytest

from workers.lab_protocol import (
    MAX_CHUNK,
    LabFrameError,
    MessageJoiner,
    TokenScrubber,
    base_url_of,
    forwarded_request_headers,
    message_entries,
    parse_in,
    parse_out,
    returned_response_headers,
)

BASE = "/sessions/7/lab/"
X = "a" * 32


def test_the_scrubber_removes_a_secret_cut_anywhere() -> None:
    secret = b"0123456789abcdef"
    text = b'{"token": "0123456789abcdef", "x": "0123456789abcdef"}' * 3
    for size in (1, 2, 5, 15, 16, 17, 1000):
        scrubber = TokenScrubber(secret)
        out = b"".join(scrubber.feed(text[i : i + size]) for i in range(0, len(text), size))
        out += scrubber.flush()
        assert out == text.replace(secret, b""), size
    scrubber = TokenScrubber(b"tok")
    assert scrubber.feed(b"ttokok") + scrubber.flush() == b""  # no joined halves survive


def test_the_portals_identity_never_reaches_jupyter_nor_jupyters_cookies_the_browser() -> None:
    sent = forwarded_request_headers(
        [
            ("Cookie", "sessionid=s; csrftoken=c"),
            ("Authorization", "Token portal-secret"),
            ("X-CSRFToken", "c"),
            ("X-XSRFToken", "x"),
            ("Origin", "http://evil"),
            ("Accept", "application/json"),
        ],
        "jt",
    )
    assert sent == (("Accept", "application/json"), ("Authorization", "token jt"))
    back = returned_response_headers([("Set-Cookie", "_xsrf=1"), ("Content-Type", "text/html")])
    assert back == (("Content-Type", "text/html"),)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({b"x": b"zz", b"t": b"e"}, "32 hexadecimal"),
        ({b"x": X.encode(), b"t": b"h", b"m": b"TRACE", b"p": BASE.encode()}, "not relayed"),
        ({b"x": X.encode(), b"t": b"h", b"m": b"GET", b"p": b"/admin/"}, "must start with"),
        ({b"x": X.encode(), b"t": b"h", b"m": b"GET", b"p": (BASE + "../../x").encode()}, "'..'"),
        ({b"x": X.encode(), b"t": b"h", b"m": b"GET", b"p": (BASE + "a\r\nb").encode()}, "control"),
        (
            {
                b"x": X.encode(),
                b"t": b"h",
                b"m": b"GET",
                b"p": BASE.encode(),
                b"hd": b'[["a b","c"]]',
            },
            "header name",
        ),
        (
            {
                b"x": X.encode(),
                b"t": b"h",
                b"m": b"GET",
                b"p": BASE.encode(),
                b"hd": b'[["A","\\n"]]',
            },
            "value",
        ),
        ({b"x": X.encode(), b"t": b"b", b"d": b"x" * (MAX_CHUNK + 1)}, "over"),
        ({b"x": X.encode(), b"t": b"w", b"d": b"x", b"k": b"q"}, "text"),
        ({b"x": X.encode(), b"t": b"c", b"cc": b"99"}, "within"),
        ({b"x": X.encode(), b"t": b"?"}, "unknown"),
    ],
)
def test_a_bad_entry_is_refused(fields: dict[bytes, bytes], problem: str) -> None:
    with pytest.raises(LabFrameError, match=problem):
        parse_in(fields, BASE)


def test_a_response_status_out_of_range_is_refused() -> None:
    with pytest.raises(LabFrameError):
        parse_out({b"t": b"h", b"s": b"999", b"hd": b"[]"})


def test_a_big_message_travels_in_pieces_and_comes_back_whole() -> None:
    data = bytes(range(256)) * 5000
    entries = message_entries(data, "b")
    assert len(entries) == -(-len(data) // MAX_CHUNK) > 1
    joiner = MessageJoiner()
    wholes = [
        joiner.add(
            parse_out({k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in e.items()})
        )
        for e in entries
    ]
    assert wholes[:-1] == [None] * (len(entries) - 1) and wholes[-1] == data


def test_base_url_of_a_runtime_name() -> None:
    assert base_url_of("job-42") == "/sessions/42/lab/"
    with pytest.raises(ValueError):
        base_url_of("job-0x1")
