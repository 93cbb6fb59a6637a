"""Moving models between apps keeps every row: the tables stay, only Django's state moves.

Tenants, memberships, servers, GPUs and jobs written under the old layout
(models in the portal app) are read back under the new one (tenancy and
inventory apps), with their foreign keys intact.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

OLD_LAYOUT = [
    ("portal", "0002_inventory"),
    ("jobs", "0006_measured_curve"),
    ("tenancy", None),
    ("inventory", None),
]


def _migrate(targets: list[tuple[str, str | None]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


@pytest.mark.django_db(transaction=True)
def test_rows_written_in_the_portal_app_survive_the_move() -> None:
    executor = _migrate(OLD_LAYOUT)
    old = executor.loader.project_state(OLD_LAYOUT[:2]).apps
    user = old.get_model("auth", "User").objects.create(username="old-owner")
    tenant = old.get_model("portal", "Tenant").objects.create(slug="old", name="Old", gpu_quota=3)
    old.get_model("portal", "Membership").objects.create(user=user, tenant=tenant, role="owner")
    server = old.get_model("portal", "Server").objects.create(node="n0", leaf=0, slot=0)
    gpu = old.get_model("portal", "Gpu").objects.create(index=0, server=server, local=0)
    job = old.get_model("jobs", "Job").objects.create(
        tenant=tenant,
        submitter=user,
        name="kept",
        workload="mlp-digits",
        gpus=1,
        min_gpus=1,
        max_gpus=1,
        batch_size=32,
        submitted_at=timezone.now(),
    )
    old.get_model("jobs", "JobGpu").objects.create(job=job, gpu=gpu, rank=0)

    executor = _migrate(executor.loader.graph.leaf_nodes())
    new = executor.loader.project_state(executor.loader.graph.leaf_nodes()).apps
    moved = new.get_model("tenancy", "Tenant").objects.get(slug="old")
    assert moved.gpu_quota == 3 and moved.memberships.get().user.username == "old-owner"
    kept = new.get_model("jobs", "Job").objects.get(name="kept")
    assert kept.tenant_id == moved.pk
    assert kept.gpu_slots.get().gpu.server.node == "n0"
    assert new.get_model("inventory", "Gpu").objects.get(index=0).assignment.job_id == kept.pk
