"""Settings split by purpose: ``base`` (everything, read from the environment),
``dev`` (the embedded default of ``make run``), ``test`` and ``prod``."""

# What manage.py, ASGI, WSGI and Celery load when DJANGO_SETTINGS_MODULE is unset: the
# environment alone, DEBUG off, so it refuses to start without SECRET_KEY (see ``safety``).
# ``make run`` selects ``dev`` explicitly.
DEFAULT_SETTINGS = "portal.settings.base"
