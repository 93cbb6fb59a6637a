"""Django admin for jobs (read-mostly: state changes go through the services)."""

from django.contrib import admin

from jobs.models import Job, JobEvent


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in JobEvent._meta.fields]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "name", "tenant", "state", "parallelism", "gpus", "submitted_at"]
    list_filter = ["state", "tenant", "workload"]
    search_fields = ["name"]
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [JobEventInline]
