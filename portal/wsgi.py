"""WSGI entry point (management tools only; the portal is served over ASGI)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
application = get_wsgi_application()
