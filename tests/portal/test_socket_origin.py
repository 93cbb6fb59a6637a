"""The live socket opens only from the portal's own origin: host *and* port."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from portal.asgi import application
from portal.origin import origin_allowed, parse_origin

HOSTS = ["portal.example", "127.0.0.1", "[::1]", "testserver"]


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://portal.example:8000", "portal.example:8000", True),
        ("http://portal.example:9000", "portal.example:8000", False),  # another port
        ("http://portal.example:8000", "portal.example", False),
        ("http://portal.example", "portal.example", True),
        ("http://portal.example:80", "portal.example", True),
        ("https://portal.example", "portal.example", True),  # TLS ended at a proxy
        ("https://portal.example:8443", "portal.example", False),
        ("http://evil.example", "evil.example", False),  # not an allowed host
        ("http://evil.example:8000", "portal.example:8000", False),
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("http://PORTAL.example:8000", "portal.EXAMPLE:8000", True),
        ("null", "portal.example", False),
        ("", "portal.example", False),
        (None, "portal.example", False),
        ("ftp://portal.example", "portal.example", False),
        ("http://portal.example:99999", "portal.example:99999", False),
        ("http://portal.example:8000/path", "portal.example:8000", False),
        ("http://portal.example:8000", None, False),
        ("http://portal.example:8000", "portal.example:x", False),
    ],
)
def test_origin_must_be_the_sockets_own(
    origin: str | None, host: str | None, allowed: bool
) -> None:
    assert origin_allowed(origin, host, HOSTS) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://app.example", True),
        ("https://app.example:443", True),
        ("http://app.example", False),  # another scheme, so another port
        ("https://app.example:444", False),
        ("https://eu.corp.example", True),
        ("https://corp.example", True),
        ("https://evilcorp.example", False),
        ("https://eu.corp.example:8443", False),
    ],
)
def test_trusted_origins_match_scheme_host_and_port(origin: str, allowed: bool) -> None:
    trusted = ["https://app.example", "https://*.corp.example"]
    assert origin_allowed(origin, "portal.example", HOSTS, trusted) is allowed


def test_parse_origin_makes_the_port_explicit() -> None:
    assert parse_origin("https://Portal.Example") == ("https", "portal.example", 443)
    assert parse_origin("http://h:8080") == ("http", "h", 8080)
    assert parse_origin("javascript:alert(1)") is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "connected"),
    [(b"http://testserver", True), (b"http://testserver:8001", False)],
)
def test_application_refuses_same_host_on_another_port(
    alice: Any, origin: bytes, connected: bool
) -> None:
    client = Client()
    client.force_login(alice)
    cookie = client.cookies["sessionid"].value

    async def scenario() -> None:
        comm = WebsocketCommunicator(
            application,
            "/ws/live/",
            headers=[
                (b"origin", origin),
                (b"host", b"testserver"),
                (b"cookie", f"sessionid={cookie}".encode()),
            ],
        )
        assert (await comm.connect())[0] is connected
        await comm.disconnect()

    asyncio.run(scenario())
