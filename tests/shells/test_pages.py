"""The pages around shells: the admins' list of open shells (live bytes, Close) and the job
page's terminal card (who is offered one, and what a portal without xterm.js says)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone

from audit.models import AuditEntry
from jobs.models import Job
from shells.models import Shell
from shells.queries import xterm_installed
from shells.services import do_open
from shells.streams import alive_key
from tenancy.models import Role, Tenant
from tests.shells.test_api import opened_shell, plan_for
from tests.shells.test_consumer import inputs

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_cluster_admins_reach_the_open_shells_page(
    alice: Any, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    shell = opened_shell(alice, acme)
    member = signed_in(alice)
    for url in ("/cluster/shells/", "/cluster/shells/open.json"):
        assert member.get(url).status_code == 404
        assert Client().get(url).status_code == 302  # to the login page
    assert member.post(f"/cluster/shells/{shell.id}/close/").status_code == 404
    assert Shell.objects.get().closed_at is None and inputs("node-1", shell.id) == []
    admin = signed_in(make_user("root-admin", staff=True))
    assert admin.get("/cluster/shells/").status_code == 200
    assert admin.post("/cluster/shells/no-such-shell/close/").status_code == 404


def test_the_page_lists_open_shells_with_the_bytes_their_consumer_counted(
    alice: Any, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    served = opened_shell(alice, acme)
    lost = do_open(user=alice, plan=plan_for(alice, served.job_id), now=timezone.now())
    ended = do_open(user=alice, plan=plan_for(alice, served.job_id), now=timezone.now())
    Shell.objects.filter(pk=ended.pk).update(closed_at=timezone.now())
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.set(alive_key(served.id), "12 3456", ex=30)
    store.set(alive_key(lost.id), "not counts", ex=30)  # never trusted as numbers
    admin = signed_in(make_user("root-admin", staff=True))
    data = admin.get("/cluster/shells/open.json").json()
    assert data["total"] == 2 and {s["id"] for s in data["shells"]} == {served.id, lost.id}
    row = next(s for s in data["shells"] if s["id"] == served.id)
    assert (row["user"], row["tenant"], row["job"], row["worker"], row["node"]) == (
        "alice", "acme", served.job_id, "w2", "node-1"
    )  # fmt: skip
    assert (row["bytes_in"], row["bytes_out"], row["served"]) == (12, 3456, True)
    other = next(s for s in data["shells"] if s["id"] == lost.id)
    assert (other["bytes_in"], other["bytes_out"], other["served"]) == (0, 0, False)
    page = admin.get("/cluster/shells/").content.decode()
    assert f'data-shell="{served.id}"' in page and f'data-shell="{ended.id}"' not in page
    assert "3.4\xa0KB" in page and f"/cluster/shells/{served.id}/close/" in page


def test_an_admin_closes_a_shell_from_the_page(
    alice: Any, acme: Tenant, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Any
) -> None:
    shell = opened_shell(alice, acme)
    admin = signed_in(make_user("root-admin", staff=True))
    with django_capture_on_commit_callbacks(execute=True):
        answer = admin.post(f"/cluster/shells/{shell.id}/close/", follow=True)
    assert answer.redirect_chain[-1][0] == "/cluster/shells/"
    assert f"Shell {shell.id[:8]} of alice in job {shell.job_id} closed." in answer.content.decode()
    closed = Shell.objects.get()
    assert closed.closed_by is not None and closed.closed_by.username == "root-admin"
    assert {b"k": b"1"} in inputs("node-1", shell.id)
    again = admin.post(f"/cluster/shells/{shell.id}/close/", follow=True)
    assert "had ended already" in again.content.decode()
    assert AuditEntry.objects.filter(action="shell.close").count() == 1


def test_the_job_page_offers_a_terminal_to_the_jobs_writers_while_it_runs(
    alice: Any, acme: Tenant, bob: Any, make_user: Callable[..., Any]
) -> None:
    job = opened_shell(alice, acme).job
    assert xterm_installed(), "npm ci has not run: make installs xterm.js (package.json)"
    page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-terminal"' in page and 'id="terminal-open"' in page
    assert '<option value="w2">w2</option><option value="w3">w3</option>' in page
    assert "/static/vendor/xterm/xterm.js" in page and "/static/js/terminal.js" in page
    viewer = make_user("vera", acme, role=Role.VIEWER)
    assert 'id="job-terminal"' not in signed_in(viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert signed_in(bob).get(f"/jobs/{job.pk}/").status_code == 404
    Job.objects.filter(pk=job.pk).update(state="completed")
    assert 'id="job-terminal"' not in signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()


def test_a_portal_without_xterm_says_its_terminal_is_unavailable(alice: Any, acme: Tenant) -> None:
    job = opened_shell(alice, acme).job
    with override_settings(STATICFILES_DIRS=[settings.BASE_DIR / "static"]):
        assert not xterm_installed()
        page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="terminal-unavailable"' in page and f"portalctl shell {job.pk}" in page
    assert 'xterm.js"></script>' not in page and "terminal.js" not in page
