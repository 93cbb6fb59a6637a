"""Django admin for jobs (read-mostly: state changes go through the services)."""

from django.contrib import admin

from jobs.models import Artifact, Job, JobEvent


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in JobEvent._meta.fields]


class ArtifactInline(admin.TabularInline):  # type: ignore[type-arg]
    """What the job stored (rows only: deleting here would leave the objects in the store)."""

    model = Artifact
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in Artifact._meta.fields]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "name", "tenant", "state", "parallelism", "gpus", "submitted_at"]
    list_filter = ["state", "tenant", "workload"]
    search_fields = ["name"]
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [JobEventInline, ArtifactInline]
