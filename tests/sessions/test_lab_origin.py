"""Each session's lab on a host of its own (``portal.lab_hosts``, ``portal.lab_ticket``,
``portal.lab_origin``): the template, the routing of hosts and paths, the portal's one-use
ticket and the lab host's own cookie, each attack refused.

The relayed lab itself (a real JupyterLab) on its own host: ``test_lab_proxy.py``'s last
test; in a real Chromium on the real stack: ``test_lab_e2e.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.utils import timezone

from inventory.models import Gpu
from inventory.services import do_load_topology
from jobs.choices import JobKind, LabAccess, Launcher
from jobs.models import Job, JobGpu
from portal.lab_hosts import (
    LabHostError,
    Route,
    check_template,
    job_id_for_host,
    lab_domain,
    lab_host,
    route,
)
from portal.lab_ticket import (
    TICKET_PARAM,
    LabAuthError,
    cookie_name,
    cookie_value,
    mint_ticket,
    read_cookie,
    read_ticket,
)
from tenancy.models import Tenant
from tenancy.services import do_remove_member

TEMPLATE = "lab-{id}.localhost"
LAB_HOSTS = override_settings(
    LAB_HOST_TEMPLATE=TEMPLATE,
    PORTAL_HOSTS=["testserver", "127.0.0.1"],
    ALLOWED_HOSTS=["testserver", "127.0.0.1", ".localhost"],
)


# --- the template and the routing (pure)


@pytest.mark.parametrize(
    "bad",
    [
        "labs.example.com",  # no {id}
        "{id}-{id}.example.com",  # twice
        "{id}",  # no domain
        "lab.{id}.example.com",  # not in the first label
        "https://{id}.example.com",  # a scheme
        "{id}.example.com:8443",  # a port
        "{id}.example.com/lab",  # a path
        "{id}.exa_mple.com",  # not a host name
        "{id}..example.com",
    ],
)
def test_a_template_that_cannot_name_one_host_per_session_is_refused(bad: str) -> None:
    with pytest.raises(LabHostError):
        check_template(bad)


def test_the_template_names_each_sessions_host_and_its_domain() -> None:
    assert check_template(" {ID}.Labs.Example.com ".replace("ID", "id")) == (
        "{id}.labs.example.com"
    )
    assert lab_host("{id}.labs.example.com", 42) == "42.labs.example.com"
    assert lab_domain("{id}.labs.example.com") == ".labs.example.com"
    assert lab_host(TEMPLATE, 7) == "lab-7.localhost"
    assert job_id_for_host(TEMPLATE, "lab-7.localhost") == 7
    assert job_id_for_host(TEMPLATE, "LAB-7.localhost:8000") == 7
    for stray in (
        "lab-.localhost",
        "lab-07.localhost",  # one host per session: 07 is not 7's
        "lab-7x.localhost",
        "lab-7.localhost.evil.example",
        "lab-1234567890123456789.localhost",
        "localhost",
        "127.0.0.1:8000",
        "[::1]:8000",
        "lab-٣.localhost",  # a non-ASCII digit
    ):
        assert job_id_for_host(TEMPLATE, stray) is None, stray


def test_each_host_serves_only_what_is_its_own() -> None:
    lab7, portal = "lab-7.localhost:8000", "127.0.0.1:8000"
    assert route("", portal, "/sessions/7/lab/x", portal_host=True) == Route("portal")
    assert route(TEMPLATE, lab7, "/sessions/7/lab/api/contents", portal_host=False) == Route(
        "lab", 7
    )
    for path in ("/", "/api/v1/me/", "/sessions/8/lab/", "/sessions/7/", "/ws/live/"):
        assert route(TEMPLATE, lab7, path, portal_host=False) == Route("not_found"), path
    assert route(TEMPLATE, portal, "/sessions/7/lab/tree", portal_host=True) == Route("reopen", 7)
    assert route(TEMPLATE, portal, "/api/v1/me/", portal_host=True) == Route("portal")
    stray = "other.localhost:8000"
    assert route(TEMPLATE, stray, "/api/v1/me/", portal_host=False) == Route("not_found")


# --- tickets and cookies (signed, pure)


def test_a_ticket_is_good_for_its_session_for_a_minute_and_cannot_be_forged() -> None:
    ticket = read_ticket(mint_ticket(3, 7), 7)
    assert (ticket.user_id, ticket.job_id, len(ticket.nonce)) == (3, 7, 32)
    assert read_ticket(mint_ticket(3, 7), 7).nonce != ticket.nonce
    with pytest.raises(LabAuthError, match="another session"):
        read_ticket(mint_ticket(3, 8), 7)
    value = mint_ticket(3, 7)
    with pytest.raises(LabAuthError, match="signature"):
        read_ticket(value[:-2] + ("AA" if not value.endswith("AA") else "BB"), 7)
    with pytest.raises(LabAuthError, match="signature"):  # a cookie is no ticket
        read_ticket(cookie_value(mock.Mock(pk=3, get_session_auth_hash=lambda: "h"), 7), 7)
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 61):
        old = mint_ticket(3, 7)
    with pytest.raises(LabAuthError, match="expired"):
        read_ticket(old, 7)


def test_a_cookie_is_good_for_its_session_until_it_expires() -> None:
    user = mock.Mock(pk=3, get_session_auth_hash=lambda: "hash")
    value = cookie_value(user, 7)
    assert read_cookie(value, 7, max_age=60)[0] == 3
    with pytest.raises(LabAuthError, match="another session"):
        read_cookie(value, 8, max_age=60)
    with pytest.raises(LabAuthError, match="signature"):  # a ticket is no cookie
        read_cookie(mint_ticket(3, 7), 7, max_age=60)
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 61):
        old = cookie_value(user, 7)
    with pytest.raises(LabAuthError, match="expired"):
        read_cookie(old, 7, max_age=60)
    assert cookie_name(7) == "lab_7"


# --- the portal's hand-over and the lab host's sign-in (Django, the database, Redis)


@pytest.fixture
def team(make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]) -> dict[str, Any]:
    """Tenant ``lab`` with a session of its owner (open to the tenant) and a member; a
    stranger in another tenant."""
    tenant = make_tenant("lab")
    owner = get_user_model().objects.get(username="lab-owner")
    make_tenant("other")
    do_load_topology({"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2})
    job = Job.objects.create(
        tenant=tenant, submitter=owner, name="lab", gpus=1, min_gpus=1, max_gpus=1,
        batch_size=1, submitted_at=timezone.now(), kind=JobKind.SESSION,
        launcher=Launcher.SESSION, idle_timeout_s=600, state="running",
        started_at=timezone.now(), lab_access=LabAccess.TENANT,
    )  # fmt: skip
    JobGpu.objects.create(job=job, gpu=Gpu.objects.get(index=2), rank=0)
    return {
        "tenant": tenant,
        "job": job,
        "owner": owner,
        "member": make_user("mia", tenant),
        "stranger": get_user_model().objects.get(username="other-owner"),
    }


@pytest.fixture
def lab_hosts() -> Iterator[None]:
    with LAB_HOSTS:
        yield


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def lab_client(job_id: int) -> Client:
    """A browser's requests to session ``job_id``'s lab host (no portal cookie goes there)."""
    return Client(HTTP_HOST=f"lab-{job_id}.localhost")


def opened(client: Client, job_id: int, query: str = "") -> str:
    """Where the portal's Open link sends ``client``."""
    answer = client.get(f"/sessions/{job_id}/lab-open/{query}")
    assert answer.status_code == 302, answer.content
    return str(answer["Location"])


@pytest.mark.django_db
def test_the_open_link_hands_the_browser_over_with_a_one_use_ticket(
    team: dict[str, Any], lab_hosts: None
) -> None:
    job = team["job"]
    base = f"/sessions/{job.pk}/lab/"
    location = urlsplit(opened(signed_in(team["owner"]), job.pk))
    assert (location.scheme, location.netloc, location.path) == (
        "http",
        f"lab-{job.pk}.localhost",
        base,
    )
    ticket = parse_qs(location.query)[TICKET_PARAM][0]
    assert read_ticket(ticket, job.pk).user_id == team["owner"].pk
    # A lab path is kept (a bookmark); anything else opens the lab's root.
    deep = opened(signed_in(team["owner"]), job.pk, f"?next={base}lab/tree/a.ipynb")
    assert urlsplit(deep).path == f"{base}lab/tree/a.ipynb"
    for elsewhere in ("/api/v1/me/", "https://evil.example/", f"/sessions/{job.pk + 1}/lab/"):
        sent = opened(signed_in(team["owner"]), job.pk, f"?next={elsewhere}")
        assert urlsplit(sent).path == base, elsewhere
    # Signed out: the login page; a stranger, or a session that does not run: 404.
    assert Client().get(f"/sessions/{job.pk}/lab-open/")["Location"].startswith("/login/")
    assert signed_in(team["stranger"]).get(f"/sessions/{job.pk}/lab-open/").status_code == 404
    Job.objects.filter(pk=job.pk).update(state="completed")
    assert signed_in(team["owner"]).get(f"/sessions/{job.pk}/lab-open/").status_code == 404


@pytest.mark.django_db
def test_without_a_template_the_open_link_goes_to_the_lab_on_the_portals_origin(
    team: dict[str, Any],
) -> None:
    job = team["job"]
    with override_settings(LAB_HOST_TEMPLATE=""):
        assert opened(signed_in(team["owner"]), job.pk) == f"/sessions/{job.pk}/lab/"


@pytest.mark.django_db
def test_a_ticket_signs_in_once_with_a_cookie_of_the_labs_own_host_and_path(
    team: dict[str, Any], lab_hosts: None
) -> None:
    job = team["job"]
    location = urlsplit(opened(signed_in(team["owner"]), job.pk, "?next=/sessions/0/lab/"))
    lab = lab_client(job.pk)
    answer = lab.get(f"{location.path}?keep=1&{location.query}")
    assert answer.status_code == 302
    assert answer["Location"] == f"/sessions/{job.pk}/lab/?keep=1"  # the ticket dropped
    cookie = answer.cookies[f"lab_{job.pk}"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
    assert cookie["path"] == f"/sessions/{job.pk}/lab/"
    assert not cookie["domain"]  # host-only: no other lab (and not the portal) gets it
    assert int(cookie["max-age"]) == 8 * 3600
    assert answer["Cache-Control"].startswith("max-age=0")
    # The same ticket again, from this browser or another: refused.
    again = lab_client(job.pk).get(f"{location.path}?{location.query}")
    assert again.status_code == 403 and b"used already" in again.content
    # The cookie signs the browser in: a session that stopped answers 404, not 403.
    Job.objects.filter(pk=job.pk).update(state="completed")
    assert lab.get(f"/sessions/{job.pk}/lab/api/contents").status_code == 404
    assert lab_client(job.pk).get(f"/sessions/{job.pk}/lab/api/contents").status_code == 403


@pytest.mark.django_db
def test_each_forged_stale_or_foreign_credential_is_refused_on_the_lab_host(
    team: dict[str, Any], lab_hosts: None
) -> None:
    job, owner = team["job"], team["owner"]
    contents = f"/sessions/{job.pk}/lab/api/contents"

    def with_ticket(value: str) -> int:
        return int(lab_client(job.pk).get(f"{contents}?{TICKET_PARAM}={value}").status_code)

    assert with_ticket("nonsense") == 403
    assert with_ticket(mint_ticket(owner.pk, job.pk + 1)) == 403  # another session's
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 61):
        stale = mint_ticket(owner.pk, job.pk)
    assert with_ticket(stale) == 403
    assert with_ticket(mint_ticket(team["stranger"].pk, job.pk)) == 404  # may not open it

    def with_cookie(value: str, name: str = f"lab_{job.pk}") -> int:
        client = lab_client(job.pk)
        client.cookies[name] = value
        return int(client.get(contents).status_code)

    Job.objects.filter(pk=job.pk).update(state="completed")  # so "signed in" reads 404
    assert with_cookie(cookie_value(owner, job.pk)) == 404
    assert with_cookie(cookie_value(owner, job.pk + 1)) == 403  # another session's
    assert with_cookie(cookie_value(owner, job.pk), name=f"lab_{job.pk + 1}") == 403
    assert with_cookie(cookie_value(owner, job.pk)[:-1] + "x") == 403
    assert with_cookie(mint_ticket(owner.pk, job.pk)) == 403  # a ticket is no cookie
    # The portal's own session cookie signs no one in on a lab host.
    portal = signed_in(owner)
    client = lab_client(job.pk)
    client.cookies.update(portal.cookies)
    assert client.get(contents).status_code == 403
    # A member the tenant removed keeps the cookie but loses the lab; a changed password or
    # a deactivated account ends the cookie.
    member_cookie = cookie_value(team["member"], job.pk)
    assert with_cookie(member_cookie) == 404
    do_remove_member(tenant=team["tenant"], user=team["member"])
    Job.objects.filter(pk=job.pk).update(state="running")
    assert with_cookie(member_cookie) == 404
    owner_cookie = cookie_value(owner, job.pk)
    owner.set_password("new-pw")
    owner.save()
    assert with_cookie(owner_cookie) == 403
    owner_cookie = cookie_value(owner, job.pk)
    owner.is_active = False
    owner.save()
    assert with_cookie(owner_cookie) == 403


@pytest.mark.django_db
def test_the_portals_host_serves_no_lab_and_a_lab_host_nothing_else(
    team: dict[str, Any], lab_hosts: None
) -> None:
    job, owner = team["job"], team["owner"]
    portal = signed_in(owner)
    page = portal.get(f"/sessions/{job.pk}/lab/lab/tree/a.ipynb")
    assert page.status_code == 302
    assert page["Location"] == (
        f"/sessions/{job.pk}/lab-open/?next=%2Fsessions%2F{job.pk}%2Flab%2Flab%2Ftree%2Fa.ipynb"
    )
    put = portal.put(f"/sessions/{job.pk}/lab/api/contents/a.txt", "{}")
    assert put.status_code == 404
    lab = lab_client(job.pk)
    lab.cookies.update(portal.cookies)  # even were the portal's cookie sent there
    for path in ("/", "/api/v1/me/", "/sessions/", f"/sessions/{job.pk}/", "/admin/"):
        assert lab.get(path).status_code == 404, path
    assert lab.get(f"/sessions/{job.pk + 1}/lab/api/contents").status_code == 404
    stray = Client(HTTP_HOST="other.localhost")
    stray.cookies.update(portal.cookies)
    assert stray.get("/api/v1/me/").status_code == 404
    assert Client(HTTP_HOST=f"lab-0{job.pk}.localhost").get("/").status_code == 404
    assert portal.get("/api/v1/me/").status_code == 200  # the portal itself is untouched


@pytest.mark.django_db
def test_a_session_pages_open_link_goes_through_the_hand_over(
    team: dict[str, Any], lab_hosts: None
) -> None:
    job = team["job"]
    owner = signed_in(team["owner"])
    link = f'href="/sessions/{job.pk}/lab-open/"'
    assert link in owner.get(f"/sessions/{job.pk}/").content.decode()
    assert link in owner.get("/sessions/").content.decode()
    assert owner.get(f"/api/v1/sessions/{job.pk}/").json()["lab_url"] == (
        f"/sessions/{job.pk}/lab-open/"
    )
