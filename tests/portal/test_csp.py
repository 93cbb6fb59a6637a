"""Content-Security-Policy: on every page, and no page depends on inline script."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from jobs.services import check_job_spec, do_submit_job
from portal.csp import HEADER, render_policy
from tenancy.models import Tenant

ROOT = Path(__file__).resolve().parents[2]

# A <script> element that runs code in the page: anything but an external file or a JSON
# data block (Django's json_script) is inline script, which the policy blocks.
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
# An event handler attribute (onclick=, onchange=, ...) is inline script too.
HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)


def directives(response: Any) -> dict[str, list[str]]:
    """The response's policy as directive -> sources."""
    assert HEADER in response, f"no {HEADER} on {response.wsgi_request.path}"
    parsed = {}
    for part in response[HEADER].split(";"):
        name, *sources = part.split()
        parsed[name] = sources
    return parsed


def assert_strict(response: Any, host: str = "testserver") -> None:
    policy = directives(response)
    assert policy["script-src"] == ["'self'"]
    assert policy["default-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"]
    assert f"ws://{host}" in policy["connect-src"]


@pytest.fixture
def staff(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


@pytest.mark.django_db
def test_every_page_carries_the_policy(staff: Client, alice: Any, acme: Tenant) -> None:
    job = do_submit_job(
        user=alice,
        tenant=acme,
        spec=check_job_spec(tenant=acme, data={"name": "t", "workload": "mlp-digits", "gpus": 1}),
    )
    member = Client()
    member.force_login(alice)
    anonymous = Client()
    pages = [
        (anonymous, "/login/", 200),
        (anonymous, "/", 302),
        (anonymous, "/no-such-page/", 404),
        (anonymous, "/api/v1/jobs/", 401),
        (anonymous, "/api/docs/", 200),
        (anonymous, "/api/docs/?script=", 200),
        (anonymous, "/admin/login/", 200),
        (member, "/", 200),
        (member, "/jobs/new/", 200),
        (member, f"/jobs/{job.pk}/", 200),
        (member, "/code/", 200),
        (member, "/account/token/", 200),
        (member, "/api/v1/jobs/", 200),
        (staff, "/cluster/", 200),
        (staff, "/cluster/topology/", 200),
        (staff, "/whatif/", 200),
        (staff, "/admin/", 200),
    ]
    for client, path, status in pages:
        response = client.get(path)
        assert response.status_code == status, path
        assert_strict(response)
        if response.get("Content-Type", "").startswith("text/html"):
            html = response.content.decode()
            assert not INLINE_SCRIPT.search(html), (path, INLINE_SCRIPT.search(html))
            assert not HANDLER.search(html), (path, HANDLER.search(html))


@pytest.mark.django_db
def test_socket_origin_follows_the_request(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["portal.example.org"]
    response = Client().get("/login/", HTTP_HOST="portal.example.org:8443")
    assert_strict(response, host="portal.example.org:8443")
    secure = Client().get("/login/", HTTP_HOST="portal.example.org", secure=True)
    assert "wss://portal.example.org" in directives(secure)["connect-src"]
    assert "ws://portal.example.org" not in directives(secure)["connect-src"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "host", ["evil.example", "x; script-src *", "testserver; script-src 'unsafe-inline'"]
)
def test_a_hostile_host_cannot_write_into_the_policy(host: str) -> None:
    """A Host header outside ALLOWED_HOSTS gets a 400 with the policy, and no say in it."""
    response = Client().get("/login/", HTTP_HOST=host)
    assert response.status_code == 400
    policy = directives(response)
    assert policy["script-src"] == ["'self'"]
    assert policy["connect-src"] == ["'self'"]
    assert "*" not in response[HEADER] and "unsafe-inline'" not in str(policy["script-src"])


def test_templates_have_no_inline_script_or_handlers() -> None:
    """Inline code is blocked by the policy: it belongs in static/js."""
    offenders = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        text = template.read_text()
        for pattern in (INLINE_SCRIPT, HANDLER):
            offenders += [
                f"{template.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)
            ]
    assert not offenders, offenders


def test_render_policy() -> None:
    policy = {"default-src": ["'self'"], "connect-src": ["'self'"], "img-src": ["'self'", "data:"]}
    assert render_policy(policy) == "default-src 'self'; connect-src 'self'; img-src 'self' data:"
    assert render_policy(policy, socket_origin="ws://h:1") == (
        "default-src 'self'; connect-src 'self' ws://h:1; img-src 'self' data:"
    )
