"""WSGI entry point (management tools only; the portal is served over ASGI)."""

import os

from django.core.wsgi import get_wsgi_application

from portal.settings import DEFAULT_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
application = get_wsgi_application()
