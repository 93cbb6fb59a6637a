"""Webhooks cannot reach inside: refused addresses, the address pinned, one deadline, a body cap.

Every test here plays the attacker (a user choosing a webhook URL) against the
real subscription API and the real sender, with real sockets on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from notifications.addresses import refusal
from notifications.models import Subscription
from notifications.sending import post_webhook
from notifications.services import enqueue_delivery
from tests.notifications.conftest import queued_tasks
from tests.notifications.receiver import Receiver

URL = "/api/v1/subscriptions/"

REFUSED = [
    "http://127.0.0.1:9/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:169.254.169.254]/latest/",
    "http://[fd00:ec2::254]/latest/",
    "http://[fe80::1]/hook",
    "http://0.0.0.0/hook",
    "http://[::]/hook",
    "http://10.0.0.1/hook",
    "http://172.16.3.4/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http://[64:ff9b::7f00:1]/hook",
    "http://[2002:7f00:1::]/hook",
    "http://localhost:6379/",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", REFUSED)
def test_a_subscription_to_an_inside_address_is_refused_naming_the_url(
    alice: Any, token_client: Callable[[Any], Any], url: str
) -> None:
    assert not getattr(django_settings, "WEBHOOK_ALLOWED_NETWORKS", [])  # default: nothing inside
    answer = token_client(alice).post(
        URL, {"events": ["completed"], "channel": "webhook", "url": url}, format="json"
    )
    assert answer.status_code == 400, answer.json()
    assert "url" in answer.json()["errors"], answer.json()
    assert "Webhooks may only call public addresses" in answer.json()["message"]
    assert not Subscription.objects.exists()


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == ""


def test_the_allow_list_opens_its_networks_and_never_a_metadata_address() -> None:
    allowed = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("169.254.0.0/16"))
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) == ""
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1"), allowed) == ""
    assert refusal(ipaddress.ip_address("10.0.0.1"), allowed) == "10.0.0.1 is a private address"
    assert "metadata" in refusal(ipaddress.ip_address("169.254.169.254"), allowed)


@pytest.mark.django_db
def test_a_send_to_an_inside_address_is_refused_without_a_connection(
    receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    outcome = post_webhook(
        url=receiver.url,
        secret="s",
        payload={"type": "job.test"},
        delivery_id=1,
        now=timezone.now(),
    )
    assert not outcome.ok and outcome.status_code is None
    assert "127.0.0.1 is a loopback address" in outcome.error
    assert receiver.requests == []


@pytest.mark.django_db
def test_the_address_checked_is_the_address_connected_to(
    receiver: Receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers a public address first, then the receiver's loopback."""
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    settings.WEBHOOK_TIMEOUT_S = 1.0
    settings.WEBHOOK_ALLOW_PRIVATE = False  # what the old sender needed to check at all
    port = int(receiver.url.split(":")[2].split("/")[0])
    answers = iter(["8.8.8.8"] + ["127.0.0.1"] * 10)
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.example":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    outcome = post_webhook(
        url=f"http://rebind.example:{port}/hooks/gpu",
        secret="s",
        payload={"type": "job.test"},
        delivery_id=1,
        now=timezone.now(),
    )
    assert receiver.requests == [], "the sender resolved again and reached the loopback receiver"
    assert not outcome.ok


class SlowServer:
    """A server on 127.0.0.1 that answers each request with ``answer(conn)`` in a thread."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.answer = answer
        self.sent = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            try:
                self.answer(conn)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def allow_loopback(settings: Any) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.WEBHOOK_ALLOW_PRIVATE = True


def _post(url: str) -> Any:
    return post_webhook(
        url=url, secret="s", payload={"type": "job.test"}, delivery_id=1, now=timezone.now()
    )


def test_one_deadline_bounds_the_whole_attempt(allow_loopback: None, settings: Any) -> None:
    """A server that drips one byte every 0.2 s never trips a per-read timeout of 1 s."""
    settings.WEBHOOK_TIMEOUT_S = 1.0

    def drip(conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + b"X-Slow: y\r\n" * 4 + b"\r\n":
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    server = SlowServer(drip)
    try:
        started = time.monotonic()
        outcome = _post(server.url)
        took = time.monotonic() - started
    finally:
        server.close()
    assert took < 2.0, f"one attempt took {took:.1f} s with a deadline of 1 s"
    assert not outcome.ok


def test_the_answer_is_read_up_to_a_cap(allow_loopback: None, settings: Any) -> None:
    """A 64 MB answer: the sender reads its status and hangs up, whatever the body."""
    settings.WEBHOOK_TIMEOUT_S = 5.0
    offered = 64 * 1024 * 1024
    server: SlowServer

    def flood(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % offered)
        chunk = b"x" * 65536
        while server.sent < offered:
            conn.sendall(chunk)
            server.sent += len(chunk)

    server = SlowServer(flood)
    try:
        outcome = _post(server.url)
        time.sleep(0.2)  # let the server's last write fail or finish
    finally:
        server.close()
    assert outcome.ok and outcome.status_code == 200
    assert server.sent < offered // 4, f"the sender read {server.sent} bytes of the body"


@pytest.mark.django_db
def test_a_redirect_is_a_failed_attempt_and_not_followed(
    allow_loopback: None, receiver: Receiver
) -> None:
    target = Receiver().start()
    try:
        receiver.statuses = [302]
        outcome = _post(receiver.url)
    finally:
        target.stop()
    assert not outcome.ok and outcome.status_code == 302 and outcome.error == "HTTP 302"
    assert target.requests == []


def test_deliveries_go_to_their_own_queue(webhooks_queue: Any) -> None:
    """Reports and heartbeats share ``portal``/``heartbeats``: deliveries never wait there."""
    enqueue_delivery(12345)
    assert queued_tasks(webhooks_queue) == [("notifications.deliver", [12345])]
    routes = django_settings.CELERY_TASK_ROUTES
    assert routes["notifications.deliver"] == {"queue": "webhooks"}


def test_a_resolver_that_never_answers_does_not_hold_the_attempt(
    allow_loopback: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.WEBHOOK_TIMEOUT_S = 1.0
    settings.WEBHOOK_ALLOW_PRIVATE = False
    real = socket.getaddrinfo

    def stuck(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow-dns.example":
            time.sleep(3.0)  # a resolver that answers late (a name server that drops queries)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    started = time.monotonic()
    outcome = _post("http://slow-dns.example/hook")
    took = time.monotonic() - started
    assert not outcome.ok and took < 2.0, f"the attempt took {took:.1f} s: {outcome.error}"
    assert "timed out resolving" in outcome.error
