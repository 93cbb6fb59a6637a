"""The jobs app: training jobs, their lifecycle and history, the REST API."""

from django.apps import AppConfig
from django.db.models.signals import post_save

LIVE_HISTORY_UID = "jobs-live-history"


class JobsConfig(AppConfig):
    """App config for ``jobs``."""

    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Send every new history row to its job's page (``jobs.live.patches.history_saved``)."""
        from jobs.live.patches import history_saved
        from jobs.models import JobEvent

        post_save.connect(history_saved, sender=JobEvent, dispatch_uid=LIVE_HISTORY_UID)
