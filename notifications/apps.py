"""The notifications app: subscriptions, deliveries, and the receiver on jobs' history."""

from django.apps import AppConfig
from django.db.models.signals import post_save

DISPATCH_UID = "notifications-job-event"


class NotificationsConfig(AppConfig):
    """App config for ``notifications``; connects the JobEvent receiver."""

    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Listen to every new job event (``jobs.lifecycle.record`` writes them all)."""
        from jobs.models import JobEvent
        from notifications.signals import job_event_saved

        post_save.connect(job_event_saved, sender=JobEvent, dispatch_uid=DISPATCH_UID)
