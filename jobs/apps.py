"""The jobs app: training jobs, their lifecycle and history, the REST API."""

from django.apps import AppConfig
from django.db.models.signals import post_save

LIVE_HISTORY_UID = "jobs-live-history"
WORKFLOW_UID = "jobs-workflow-release"


class JobsConfig(AppConfig):
    """App config for ``jobs``."""

    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Send every new history row to its job's page (``jobs.live.patches.history_saved``);
        release what waited for a job that ends (``jobs.workflow_events``)."""
        from jobs.live.patches import history_saved
        from jobs.models import JobEvent
        from jobs.workflow_events import job_event_saved

        post_save.connect(history_saved, sender=JobEvent, dispatch_uid=LIVE_HISTORY_UID)
        post_save.connect(job_event_saved, sender=JobEvent, dispatch_uid=WORKFLOW_UID)
