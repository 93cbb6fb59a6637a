"""Django admin for jobs: read-only.

Every change to a job goes through ``jobs.services``, which writes its audit
row; an admin edit here would bypass both, so the admin may look, not touch
(cancel or change a job on its page or through the API).
"""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from jobs.models import Artifact, Job, JobEvent
from utilities.admin import ReadOnlyAdminMixin


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in JobEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ArtifactInline(admin.TabularInline):  # type: ignore[type-arg]
    """What the job stored (rows only: deleting here would leave the objects in the store)."""

    model = Artifact
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in Artifact._meta.fields]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "name", "tenant", "state", "parallelism", "gpus", "submitted_at"]
    list_filter = ["state", "tenant", "workload"]
    search_fields = ["name"]
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [JobEventInline, ArtifactInline]
