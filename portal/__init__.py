"""The portal project: settings, ASGI, URLs, tenancy, pages and the Celery app."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
