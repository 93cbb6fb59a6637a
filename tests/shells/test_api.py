"""``/api/v1/shells/``: members see their tenants' shells, admins see all and close one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from shells.models import Shell
from shells.services import (
    ShellPlan,
    ShellRefused,
    check_open,
    do_close,
    do_open,
    do_request_close,
)
from shells.streams import alive_key, input_key
from tenancy.models import Role, Tenant
from tests.shells.test_consumer import inputs, running

pytestmark = pytest.mark.django_db


def plan_for(user: Any, job_id: int) -> ShellPlan:
    return check_open(
        user=user, job_id=job_id, worker=None, argv=[], term="xterm", rows=24, cols=80
    )


def opened_shell(user: Any, tenant: Tenant) -> Shell:
    job = running(user, tenant)
    return do_open(user=user, plan=plan_for(user, job.pk), now=timezone.now())


def test_members_list_their_tenants_shells_only(
    alice: Any, acme: Tenant, bob: Any, token_client: Callable[[Any], APIClient]
) -> None:
    shell = opened_shell(alice, acme)
    mine = token_client(alice).get("/api/v1/shells/?open=1")
    assert mine.status_code == 200 and [s["id"] for s in mine.json()["results"]] == [shell.id]
    assert mine.json()["results"][0]["worker_id"] == "w2"
    theirs = token_client(bob).get("/api/v1/shells/")
    assert theirs.json()["results"] == []
    assert token_client(bob).get(f"/api/v1/shells/{shell.id}/").status_code == 404


def test_only_an_admin_closes_a_shell_and_the_agent_is_told(
    alice: Any,
    acme: Tenant,
    bob: Any,
    make_user: Callable[..., Any],
    token_client: Callable[[Any], APIClient],
    django_capture_on_commit_callbacks: Any,
) -> None:
    shell = opened_shell(alice, acme)
    url = f"/api/v1/shells/{shell.id}/close/"
    assert token_client(alice).post(url).status_code == 403
    assert token_client(bob).post(url).status_code == 403
    assert Shell.objects.get().closed_at is None and {b"k": b"1"} not in inputs("node-1", shell.id)
    admin = make_user("root-admin", staff=True)
    with django_capture_on_commit_callbacks(execute=True):
        answer = token_client(admin).post(url)
    assert answer.status_code == 200, answer.json()
    assert answer.json()["closed_by"] == "root-admin" and answer.json()["closed_at"]
    assert {b"k": b"1"} in inputs("node-1", shell.id), input_key("node-1", shell.id)
    entry = AuditEntry.objects.get(action="shell.close", object_id=shell.id)
    assert entry.actor_name == "root-admin" and entry.after["reason"] == "closed by root-admin"
    assert token_client(admin).post(url).status_code == 200  # closing again changes nothing
    assert AuditEntry.objects.filter(action="shell.close").count() == 1


@override_settings(SHELL_MAX_OPEN_PER_USER=2)
def test_shells_no_portal_process_serves_stop_counting_against_the_limit(
    alice: Any, acme: Tenant
) -> None:
    """The portal process of an open shell ended (a restart): its row would stay open and
    count against the user's limit forever; the next open closes it, and tells the agent."""
    lost = opened_shell(alice, acme)
    served = do_open(user=alice, plan=plan_for(alice, lost.job_id), now=timezone.now())
    long_ago = timezone.now() - timedelta(minutes=5)
    Shell.objects.update(opened_at=long_ago)
    redis.Redis.from_url(settings.REDIS_URL).set(alive_key(served.id), "1", ex=30)
    plan_for(alice, lost.job_id)  # not refused: the lost one no longer counts
    assert Shell.objects.get(pk=lost.pk).close_reason == "lost: no portal process serves it"
    assert Shell.objects.get(pk=served.pk).closed_at is None
    assert {b"k": b"1"} in inputs("node-1", lost.id)
    with pytest.raises(ShellRefused) as refused:  # two open again: the limit holds
        do_open(user=alice, plan=plan_for(alice, lost.job_id), now=timezone.now())
        plan_for(alice, lost.job_id)
    assert refused.value.status == 429


def test_an_admins_close_is_recorded_before_the_agent_ends_the_shell(
    alice: Any,
    acme: Tenant,
    make_user: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The agent ends a shell the moment it is told, and the shell's consumer records that
    end at once: told before the admin's close was recorded, the shell's own end could be
    recorded first (``closed_by`` null although the admin closed an open shell)."""
    shell = opened_shell(alice, acme)
    admin = make_user("root-admin", staff=True)
    with django_capture_on_commit_callbacks(execute=False) as told:
        assert do_request_close(shell=shell, by=admin, now=timezone.now())
    assert inputs("node-1", shell.id) == []  # nothing reached the agent before the commit
    assert Shell.objects.get().closed_by == admin
    for callback in told:
        callback()
    assert {b"k": b"1"} in inputs("node-1", shell.id)
    # The consumer reads the agent's answer (SIGKILL) and records the shell's end: the
    # admin's close stays the admin's, and the end adds its status and byte counts.
    assert not do_close(
        shell_id=shell.id,
        now=timezone.now(),
        reason="exited",
        exit_code=-9,
        bytes_in=4,
        bytes_out=9,
    )
    closed = Shell.objects.get()
    assert (closed.closed_by, closed.close_reason) == (admin, "closed by root-admin")
    assert (closed.exit_code, closed.bytes_in, closed.bytes_out) == (-9, 4, 9)
    assert AuditEntry.objects.filter(action="shell.close").count() == 1
    # A shell that ended by itself before an admin came stays its own end.
    again = do_open(user=alice, plan=plan_for(alice, shell.job_id), now=timezone.now())
    assert do_close(shell_id=again.id, now=timezone.now(), reason="exited", exit_code=0)
    assert not do_request_close(shell=Shell.objects.get(pk=again.pk), by=admin, now=timezone.now())
    assert Shell.objects.get(pk=again.pk).closed_by is None
    assert inputs("node-1", again.id) == []


def test_a_viewer_of_the_tenant_may_not_open_a_shell(
    alice: Any, acme: Tenant, make_user: Callable[..., Any]
) -> None:
    """A shell runs commands in the job's sandbox: a viewer reads the job, but gets 403."""
    job = running(alice, acme)
    viewer = make_user("vera", acme, role=Role.VIEWER)
    with pytest.raises(ShellRefused) as refused:
        plan_for(viewer, job.pk)
    assert (refused.value.status, refused.value.field) == (403, "job")
    assert not Shell.objects.exists()
