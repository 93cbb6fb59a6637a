"""Celery tasks of the portal app (found by ``autodiscover_tasks``)."""

from portal.whatif import run_whatif

__all__ = ["run_whatif"]
