"""ASGI entry point: HTTP (Django, with static files) and WebSockets (Channels)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from portal.settings import DEFAULT_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from portal.body_limit import BodyLimitMiddleware, install_in_daphne  # noqa: E402
from portal.heap import freeze_startup_heap  # noqa: E402
from portal.lab_origin import LabHostSocketGuard  # noqa: E402
from portal.origin import SameOriginValidator  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

# Request bodies are counted as they arrive and refused past their limit before anything
# is stored (portal.body_limit): in daphne's own reading of the body, and here for servers
# that stream it to the application.
install_in_daphne()
http_app = BodyLimitMiddleware(
    ASGIStaticFilesHandler(django_asgi) if settings.SERVE_STATIC else django_asgi
)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        # A lab host's sockets are its lab's only (portal.lab_origin); the page's own
        # origin, port included (not only an allowed host name).
        "websocket": LabHostSocketGuard(
            SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

# Last: the heap as it is now lives as long as the process (portal.heap).
freeze_startup_heap()
