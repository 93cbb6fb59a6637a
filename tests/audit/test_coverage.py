"""Every service write of a person or a token is audited, and never commits without its row.

The static half reads every ``*services.py`` of our apps: each public ``do_*``
function must call ``audit.services.record`` (itself or through a helper of its
module), unless it is on an allowlist below, each entry saying why.  The other
half proves, on PostgreSQL, that a real service write whose audit insert fails
is rolled back with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection

from audit.models import AuditEntry
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tenancy.models import Tenant
from tests.audit.coverage import service_functions, service_modules
from tests.conftest import job_body

ROOT = Path(__file__).resolve().parents[2]
APPS = sorted(path.parent.name for path in ROOT.glob("*/apps.py"))
"""Our Django apps: a new app's services are checked as soon as it exists."""

SYSTEM_WRITES = {
    # An agent's heartbeat, applied by the control plane's report task: the system, not a person.
    "inventory.services.do_heartbeat",
    # The tick marks silent servers down: the control plane's own action.
    "inventory.services.do_mark_silent_servers_down",
    # A straggler report marks its GPU suspect for a cool-down: the control plane acting on the
    # runtime's report (the job's history says so); an admin's clearing of the mark is audited.
    "inventory.services.do_mark_gpu_suspect",
    # Authentication notes a token's last use (at most once a minute): bookkeeping, no change
    # a person makes.
    "tenancy.token_services.do_use_token",
    # Notifications' Celery tasks: fanning a job event out to subscriptions, a delivery
    # attempt, the sweep of jobs queued too long. The portal acting on events, not a person.
    "notifications.services.do_fan_out_job_event",
    "notifications.services.do_attempt_delivery",
    "notifications.services.do_sweep_queued_long",
}
"""Writes of the system itself, which the audit log leaves out (docs/audit.md)."""

ALLOWED = SYSTEM_WRITES


def _all_service_functions() -> dict[str, bool]:
    found: dict[str, bool] = {}
    for module, path in service_modules(ROOT, APPS).items():
        for function in service_functions(path.read_text(), module):
            found[function.qualname] = function.audited
    return found


def test_every_do_function_of_every_service_module_records_an_audit_row() -> None:
    assert {"jobs", "inventory", "bundles", "tenancy", "portal"} <= set(APPS)
    found = _all_service_functions()
    assert "jobs.services.do_cancel_job" in found  # the scan sees the modules at all
    assert "tenancy.token_services.do_revoke_token" in found
    missing = sorted(name for name, audited in found.items() if not audited and name not in ALLOWED)
    assert missing == [], f"these service writes leave no audit row: {missing}"


def test_the_allowlist_names_only_unaudited_functions_that_exist() -> None:
    """A stale entry (renamed, or audited now) must leave the list."""
    found = _all_service_functions()
    stale = sorted(name for name in ALLOWED if found.get(name, True))
    assert stale == [], f"remove from the allowlist: {stale}"


PLANTED = """
from audit import services as audit
from audit.services import record as audit_record
from jobs.lifecycle import record

def do_direct():
    audit.record("x.direct")

def do_aliased():
    audit_record("x.aliased")

def do_through_a_helper():
    _write()

def _write():
    _deeper()

def _deeper():
    audit.record("x.deep")

def do_job_event_only():
    record(job, "submitted")  # jobs.lifecycle.record: a job event, not an audit row

def do_nothing():
    pass

def not_a_service():
    pass
"""


def test_the_checker_follows_imports_and_helpers_and_names_what_is_missing() -> None:
    found = {f.qualname: f.audited for f in service_functions(PLANTED, "x.services")}
    assert found == {
        "x.services.do_direct": True,
        "x.services.do_aliased": True,
        "x.services.do_through_a_helper": True,
        "x.services.do_job_event_only": False,
        "x.services.do_nothing": False,
    }


def test_a_module_without_the_audit_import_is_not_audited_by_a_lookalike_name() -> None:
    source = "def record(*a):\n    pass\n\ndef do_x():\n    record('x')\n"
    assert [f.audited for f in service_functions(source, "m")] == [False]


@pytest.mark.django_db
def test_a_cancel_whose_audit_insert_fails_is_rolled_back(acme: Tenant, alice: Any) -> None:
    """No mocks: a trigger made in this test's transaction refuses the audit insert."""
    if connection.vendor != "postgresql":
        pytest.skip("the refusing trigger is PostgreSQL's")
    job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=job_body()))
    rows = AuditEntry.objects.count()
    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute(
            """
            CREATE FUNCTION pg_temp.refuse_audit() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'audit insert refused by the test'; END;
            $$ LANGUAGE plpgsql;
            CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_auditentry
                FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_audit();
            """
        )
    with pytest.raises(DatabaseError, match="audit insert refused"):
        do_cancel_job(user=alice, job_id=job.pk, reason="should not stick")
    fresh = Job.objects.get(pk=job.pk)
    assert fresh.state == JobState.QUEUED
    assert not fresh.events.filter(to_state=JobState.CANCELLED).exists()
    assert AuditEntry.objects.count() == rows
