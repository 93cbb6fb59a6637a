"""``/api/v1/shells/``: members see their tenants' shells, admins see all and close one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from shells.models import Shell
from shells.services import check_open, do_open
from shells.streams import input_key
from tenancy.models import Tenant
from tests.shells.test_consumer import inputs, running

pytestmark = pytest.mark.django_db


def opened_shell(user: Any, tenant: Tenant) -> Shell:
    job = running(user, tenant)
    plan = check_open(
        user=user, job_id=job.pk, worker=None, argv=[], term="xterm", rows=24, cols=80
    )
    return do_open(user=user, plan=plan, now=timezone.now())


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
) -> None:
    shell = opened_shell(alice, acme)
    url = f"/api/v1/shells/{shell.id}/close/"
    assert token_client(alice).post(url).status_code == 403
    assert token_client(bob).post(url).status_code == 403
    assert Shell.objects.get().closed_at is None and {b"k": b"1"} not in inputs("node-1", shell.id)
    admin = make_user("root-admin", staff=True)
    answer = token_client(admin).post(url)
    assert answer.status_code == 200, answer.json()
    assert answer.json()["closed_by"] == "root-admin" and answer.json()["closed_at"]
    assert {b"k": b"1"} in inputs("node-1", shell.id), input_key("node-1", shell.id)
    entry = AuditEntry.objects.get(action="shell.close", object_id=shell.id)
    assert entry.actor_name == "root-admin" and entry.after["reason"] == "closed by root-admin"
    assert token_client(admin).post(url).status_code == 200  # closing again changes nothing
    assert AuditEntry.objects.filter(action="shell.close").count() == 1
