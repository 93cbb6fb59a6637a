"""The admin page and API of the nodes' environment caches, and the reports behind them.

Reports go through the real signed path (``handle_signed_report``, as the
report task calls it); evictions through the page and the API, the command to
the node's real queue, the agent's answer back through the signed path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from control.reports import handle_signed_report
from jobs import agent_trust
from jobs.environment_caches import do_request_eviction
from jobs.models import CachedEnvironment, EnvironmentEviction, NodeEnvironmentCache
from tests.jobs.control_helpers import demo_cluster, drain_queue
from workers.protocol import (
    CachedEnvironment as CachedEntry,
)
from workers.protocol import (
    EnvironmentCacheReport,
    EnvironmentEvicted,
    Report,
)
from workers.signing import seal

pytestmark = pytest.mark.django_db

KEY_A = "a" * 32
KEY_B = "b" * 32


@pytest.fixture
def nodes() -> list[str]:
    return demo_cluster()


@pytest.fixture
def root(make_user: Callable[..., Any]) -> Any:
    return make_user("root", staff=True)


@pytest.fixture
def admin(root: Any) -> Client:
    client = Client()
    client.force_login(root)
    return client


def signed(body: dict[str, Any], *, signer: str, at: float | None = None) -> dict[str, Any]:
    """``body`` sealed as ``signer``'s agent would."""
    return seal(
        body, node=signer, key=agent_trust.key_of(signer), now=time.time() if at is None else at
    )


def cache_of(node: str, *entries: CachedEntry, at: float | None = None) -> EnvironmentCacheReport:
    return EnvironmentCacheReport(
        node=node,
        at=time.time() if at is None else at,
        max_bytes=10 * 2**30,
        total_bytes=sum(e.size_bytes for e in entries),
        entries=entries,
    )


def entry(key: str, *, in_use: bool = False, packages: tuple[str, ...] = ()) -> CachedEntry:
    return CachedEntry(
        key=key,
        size_bytes=3 * 2**20,
        last_used=time.time() - 60,
        in_use=in_use,
        packages=packages,
        requirements=tuple(p.split("==")[0] for p in packages),
    )


def send(report: Report, signer: str | None = None) -> str:
    return handle_signed_report(signed(report.to_dict(), signer=signer or report.node))


def stored() -> list[tuple[str, str, int, bool, list[str]]]:
    return sorted(
        (e.cache.server.node, e.key, e.size_bytes, e.in_use, e.packages)
        for e in CachedEnvironment.objects.select_related("cache__server")
    )


# --------------------------------------------------------------------------- who may see it


def test_nobody_but_an_admin_lists_or_evicts(
    nodes: list[str], alice: Any, make_user: Callable[..., Any], token_client: Any
) -> None:
    """A tenant's member, even its owner, gets the 404 of any admin page and the API's 403."""
    node = nodes[0]
    assert send(cache_of(node, entry(KEY_A))) == "environment cache"
    owner = make_user("acme-boss")
    for user in (alice, owner):
        client = Client()
        client.force_login(user)
        assert client.get("/cluster/environments/").status_code == 404
        assert client.post(f"/cluster/environments/{node}/{KEY_A}/evict/").status_code == 404
        assert b"Environments" not in client.get("/").content  # not in the nav either
        api = token_client(user)
        assert api.get("/api/v1/environments/").status_code == 403
        assert api.get("/api/v1/environments/evictions/").status_code == 403
        assert api.post(f"/api/v1/environments/{node}/{KEY_A}/evict/").status_code == 403
    anonymous = Client()
    assert anonymous.get("/cluster/environments/").status_code == 302  # to the login page
    assert APIClient().get("/api/v1/environments/").status_code in (401, 403)
    assert not EnvironmentEviction.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="environment.").exists()
    assert drain_queue(node) == []


def test_an_eviction_needs_the_pages_csrf_token(nodes: list[str], root: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(root)
    assert client.post(f"/cluster/environments/{nodes[0]}/{KEY_A}/evict/").status_code == 403
    assert not EnvironmentEviction.objects.exists()


# --------------------------------------------------------------------------- reports


def test_each_report_replaces_its_nodes_listing_and_an_older_one_is_ignored(
    nodes: list[str],
) -> None:
    first, second = nodes[:2]
    now = time.time()
    assert send(cache_of(first, entry(KEY_A), entry(KEY_B), at=now - 10)) == "environment cache"
    assert send(cache_of(second, entry(KEY_A, in_use=True), at=now)) == "environment cache"
    assert send(cache_of(first, entry(KEY_B, packages=("six==1.16.0",)), at=now)) == (
        "environment cache"
    )
    expected = [
        (first, KEY_B, 3 * 2**20, False, ["six==1.16.0"]),
        (second, KEY_A, 3 * 2**20, True, []),
    ]
    assert stored() == expected
    assert send(cache_of(first, entry(KEY_A), at=now - 5)) == "stale"  # arrived late
    assert stored() == expected


def oversized_entries() -> list[dict[str, Any]]:
    packages = [f"{'p' * 190}=={i}" for i in range(1000)]
    return [entry(f"{i:032x}").to_dict() | {"packages": packages} for i in range(2)]


@pytest.mark.parametrize(
    "change",
    [
        {"entries": [{"key": "../../etc/passwd", "size_bytes": 1, "last_used": 1.0}]},
        {"entries": [{"key": KEY_A, "size_bytes": -1, "last_used": 1.0}]},
        {"entries": [{"key": KEY_A, "size_bytes": 1, "last_used": 1.0, "tenant": "acme"}]},
        {"entries": oversized_entries()},
        {"entries": [{"key": f"{i:032x}", "size_bytes": 1, "last_used": 1.0} for i in range(257)]},
        {"total_bytes": 2**70},
        {"max_bytes": None},
    ],
    ids=["path-key", "negative", "unknown-field", "oversized", "too-many", "huge", "null"],
)
def test_a_malformed_or_oversized_report_changes_nothing(
    nodes: list[str], change: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    node = nodes[0]
    send(cache_of(node, entry(KEY_A)))
    before = (stored(), list(NodeEnvironmentCache.objects.values()))
    body = cache_of(node, entry(KEY_B)).to_dict() | change
    outcome = handle_signed_report(signed(body, signer=node))
    assert outcome.startswith("invalid")
    assert "rejected agent report" in caplog.text
    assert (stored(), list(NodeEnvironmentCache.objects.values())) == before


def test_a_node_reports_only_its_own_cache(nodes: list[str]) -> None:
    victim, liar = nodes[:2]
    assert send(cache_of(victim, entry(KEY_A)), signer=liar) == "refused: wrong node"
    stranger = "not-a-server"
    assert send(cache_of(stranger, entry(KEY_A))) == "unknown node"
    assert stored() == []


# --------------------------------------------------------------------------- the page


def test_the_page_lists_every_nodes_entries(nodes: list[str], admin: Client) -> None:
    node = nodes[0]
    send(cache_of(node, entry(KEY_A, in_use=True, packages=("six==1.16.0", "idna==3.6"))))
    page = admin.get("/cluster/environments/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="env-{node}-{KEY_A}"' in html and 'data-in-use="1"' in html
    assert KEY_A[:12] in html and "six==1.16.0, idna==3.6" in html
    assert "3.0\xa0MB of 10.0\xa0GB" in html  # its total against its cap
    assert f'action="/cluster/environments/{node}/{KEY_A}/evict/"' in html
    assert "has not reported its cache yet" in html  # the other nodes
    assert 'href="/cluster/environments/"' in html  # the admin's nav


# --------------------------------------------------------------------------- evictions


def test_an_eviction_is_sent_signed_audited_and_answered_by_its_node_only(
    nodes: list[str],
    admin: Client,
    root: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    node, other = nodes[:2]
    send(cache_of(node, entry(KEY_A), entry(KEY_B)))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(f"/cluster/environments/{node}/{KEY_A}/evict/")
    assert response.status_code == 302 and response["Location"] == "/cluster/environments/"
    [eviction] = EnvironmentEviction.objects.all()
    assert (eviction.key, eviction.outcome, eviction.requested_by) == (KEY_A, "pending", root)
    [command] = drain_queue(node)  # signed for that node: drain_queue checks
    assert command == {
        "type": "evict_environment",
        "job": "node",
        "command_id": eviction.command_id,
        "key": KEY_A,
    }
    asked = AuditEntry.objects.get(action="environment.evict")
    assert asked.actor_name == "root" and asked.after["node"] == node

    answer = EnvironmentEvicted(
        node=node, command_id=eviction.command_id, key=KEY_A, outcome="evicted"
    )
    forged = EnvironmentEvicted(**{**answer.__dict__, "node": other})
    assert send(forged) == "unknown eviction"  # another node cannot answer for it
    assert send(answer) == "eviction evicted"
    assert send(answer) in ("duplicate", "duplicate: applied already")
    eviction.refresh_from_db()
    assert eviction.outcome == "evicted" and eviction.answered_at is not None
    assert [key for _, key, *_ in stored()] == [KEY_B]  # gone from the listing at once
    assert AuditEntry.objects.filter(action="environment.evicted").count() == 1
    page = admin.get("/cluster/environments/").content.decode()
    assert 'data-outcome="evicted"' in page


def test_a_refused_eviction_shows_the_agents_reason(
    nodes: list[str], admin: Client, django_capture_on_commit_callbacks: Any
) -> None:
    node = nodes[0]
    send(cache_of(node, entry(KEY_A, in_use=True)))
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(f"/cluster/environments/{node}/{KEY_A}/evict/")
    [command] = drain_queue(node)
    why = f"in use on {node} by job-3/w0"
    answer = EnvironmentEvicted(
        node=node, command_id=command["command_id"], key=KEY_A, outcome="in_use", detail=why
    )
    assert send(answer) == "eviction in_use"
    assert [key for _, key, *_ in stored()] == [KEY_A]  # still listed
    page = admin.get("/cluster/environments/").content.decode()
    assert "Refused: in use" in page and why in page


def test_a_key_the_node_no_longer_has_leaves_the_listing(
    nodes: list[str], root: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = nodes[0]
    send(cache_of(node, entry(KEY_A)))
    with django_capture_on_commit_callbacks(execute=True):
        eviction = do_request_eviction(node=node, key=KEY_A, user=root)
    drain_queue(node)
    answer = EnvironmentEvicted(
        node=node, command_id=eviction.command_id, key=KEY_A, outcome="not_found"
    )
    assert send(answer) == "eviction not_found"
    assert stored() == []


def test_a_malformed_eviction_request_sends_nothing(nodes: list[str], admin: Client) -> None:
    node = nodes[0]
    for url in (
        f"/cluster/environments/{node}/not-a-key/evict/",
        f"/cluster/environments/no-such-node/{KEY_A}/evict/",
    ):
        assert admin.post(url).status_code == 302
    assert admin.get(f"/cluster/environments/{node}/{KEY_A}/evict/").status_code == 405
    assert not EnvironmentEviction.objects.exists()
    assert drain_queue(node) == []


def test_the_api_lists_and_evicts(
    nodes: list[str], root: Any, token_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = nodes[0]
    send(cache_of(node, entry(KEY_A, packages=("six==1.16.0",))))
    api = token_client(root)
    listing = {row["node"]: row for row in api.get("/api/v1/environments/").json()}
    assert set(listing) == set(nodes)
    [listed] = listing[node]["entries"]
    assert listed["key"] == KEY_A and listed["packages"] == ["six==1.16.0"]
    assert listing[node]["max_bytes"] == 10 * 2**30 and listing[nodes[1]]["reported_at"] is None
    assert api.post(f"/api/v1/environments/{node}/zz/evict/").status_code == 400
    assert api.post(f"/api/v1/environments/nowhere/{KEY_A}/evict/").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/v1/environments/{node}/{KEY_A}/evict/")
    assert response.status_code == 202
    body = response.json()
    assert (body["node"], body["key"], body["outcome"], body["requested_by"]) == (
        node,
        KEY_A,
        "pending",
        "root",
    )
    [command] = drain_queue(node)
    assert command["key"] == KEY_A
    [row] = api.get("/api/v1/environments/evictions/").json()
    assert row["id"] == body["id"]


def test_odd_names_in_the_path_are_refused_not_raised(
    nodes: list[str], root: Any, admin: Client
) -> None:
    """A NUL (which PostgreSQL refuses in a query), a long name: a 4xx, never a 500."""
    node = nodes[0]
    api = APIClient()
    api.force_authenticate(root)
    assert api.post(f"/api/v1/environments/a%00b/{KEY_A}/evict/").status_code == 404
    assert api.post(f"/api/v1/environments/{'n' * 300}/{KEY_A}/evict/").status_code == 404
    assert api.post(f"/api/v1/environments/{node}/{KEY_A[:31]}%00/evict/").status_code == 400
    assert admin.post(f"/cluster/environments/a%00b/{KEY_A}/evict/").status_code == 404
    assert admin.post(f"/cluster/environments/{node}/{KEY_A[:31]}%00/evict/").status_code == 302
    assert not EnvironmentEviction.objects.exists()
