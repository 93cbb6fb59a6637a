"""Production: PostgreSQL and Redis as services, a real secret, no debug, TLS only.

``manage.py check --deploy`` is clean under these settings (a test runs it).  The portal
expects HTTPS in front of it:

    SECURE_SSL_REDIRECT=1 (default)  plain-HTTP requests are redirected to https://
    SECURE_HSTS_SECONDS=31536000     browsers remember to use HTTPS (0 turns HSTS off)
    SECURE_PROXY_SSL_HEADER=1        opt-in, ONLY behind a proxy that terminates TLS and
                                     always sets (or strips) X-Forwarded-Proto: without it
                                     Django sees every proxied request as plain HTTP and
                                     redirects forever; with it and no such proxy, any
                                     client can claim HTTPS
"""

import os

from portal.settings.base import *  # noqa: F403
from portal.settings.env import env_bool, env_int

if not os.environ.get("SECRET_KEY"):
    raise RuntimeError("SECRET_KEY must be set in production")
if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
    raise RuntimeError("DATABASE_URL and REDIS_URL must be set in production")
DEBUG = False

SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
