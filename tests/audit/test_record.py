"""The audit log's core: one row per change, written in the change's transaction, never changed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory

from audit.context import acting_as, current_actor, serving, system_actor
from audit.models import AppendOnlyError, AuditEntry
from audit.services import AuditError, changed, record
from tenancy.models import Tenant


@pytest.fixture
def tenant(db: None) -> Tenant:
    return Tenant.objects.create(slug="team-a", name="Team A")


@pytest.mark.django_db
def test_a_row_names_the_request_user_how_they_signed_in_and_their_address(
    tenant: Tenant,
) -> None:
    alice = get_user_model().objects.create_user("alice")
    request = RequestFactory().post("/x", REMOTE_ADDR="10.1.2.3")
    request.user = alice
    with serving(request):
        entry = record(
            "tenant.update",
            obj=tenant,
            tenant=tenant,
            before={"gpu_quota": 8},
            after={"gpu_quota": 16},
        )
    stored = AuditEntry.objects.get(pk=entry.pk)
    assert (stored.actor_id, stored.actor_name, stored.via) == (alice.pk, "alice", "session")
    assert stored.client_address == "10.1.2.3"
    assert (stored.tenant_id, stored.tenant_slug) == (tenant.pk, "team-a")
    assert (stored.object_type, stored.object_id) == ("tenancy.tenant", str(tenant.pk))
    assert (stored.before, stored.after) == ({"gpu_quota": 8}, {"gpu_quota": 16})


@pytest.mark.django_db
def test_an_api_token_names_itself_and_a_command_names_the_system() -> None:
    class Token:
        audit_label = "token ci (abc…)"

    request = RequestFactory().get("/", REMOTE_ADDR="not-an-address")
    request.user = get_user_model().objects.create_user("bob")
    request.auth = Token()  # type: ignore[attr-defined]
    with serving(request):
        actor = current_actor()
    assert (actor.name, actor.via, actor.address) == ("bob", "token ci (abc…)", None)
    with acting_as(system_actor("manage.py drain")):
        assert current_actor().via == "manage.py drain"
    assert current_actor() == system_actor("direct")


@pytest.mark.django_db(transaction=True)
def test_a_row_outside_a_transaction_is_refused() -> None:
    with pytest.raises(AuditError, match="inside the change's transaction"):
        record("tenant.update", object_type="x", object_id="1")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_rows_cannot_be_changed_or_deleted(tenant: Tenant) -> None:
    entry = record("tenant.update", obj=tenant, tenant=tenant)
    entry.action = "forged"
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    with pytest.raises(AppendOnlyError):
        AuditEntry.objects.filter(pk=entry.pk).update(action="forged")
    with pytest.raises(AppendOnlyError):
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.get(pk=entry.pk).action == "tenant.update"


@pytest.mark.django_db
def test_postgresql_refuses_raw_updates_and_deletes(tenant: Tenant) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's; SQLite relies on the model")
    entry = record("tenant.update", obj=tenant, tenant=tenant)
    for sql in (
        "UPDATE audit_auditentry SET action = 'forged' WHERE id = %s",
        "DELETE FROM audit_auditentry WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).action == "tenant.update"


@pytest.mark.django_db
def test_a_change_whose_row_cannot_be_written_is_rolled_back(tenant: Tenant) -> None:
    """The row and the change commit together: no change without its row."""
    with pytest.raises(TypeError), transaction.atomic():
        Tenant.objects.filter(pk=tenant.pk).update(gpu_quota=99)
        record(
            "tenant.update",
            obj=tenant,
            tenant=tenant,
            object_repr="x" * 10,
            before=None,
            after={"bad": object()},
        )  # not JSON: the insert fails
    tenant.refresh_from_db()
    assert tenant.gpu_quota == 8
    assert not AuditEntry.objects.exists()


def test_changed_keeps_only_the_fields_that_differ() -> None:
    assert changed({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == (
        {"b": 2, "c": None},
        {"b": 3, "c": 4},
    )
