"""Production: PostgreSQL and Redis as services, a real secret, no debug."""

import os

from portal.settings.base import *  # noqa: F403

if not os.environ.get("SECRET_KEY"):
    raise RuntimeError("SECRET_KEY must be set in production")
if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
    raise RuntimeError("DATABASE_URL and REDIS_URL must be set in production")
DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
