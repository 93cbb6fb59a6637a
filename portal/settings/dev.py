"""The embedded default for a laptop: what ``make run`` selects explicitly.

DEBUG is on unless the environment says otherwise, so no SECRET_KEY is needed (a random
local one is kept in the data directory) and ALLOWED_HOSTS must stay loopback-only;
``portal.settings.safety`` refuses anything else.  Set before ``base`` reads it.
"""

import os

os.environ.setdefault("DEBUG", "1")
# Mail is printed on the console unless EMAIL_BACKEND (or EMAIL_URL/EMAIL_HOST) says otherwise.
if not (os.environ.get("EMAIL_URL") or os.environ.get("EMAIL_HOST")):
    os.environ.setdefault("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")

# The dev stack is loopback-only: a webhook receiver on this machine may be tried out.
os.environ.setdefault("WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")

from portal.settings.base import *  # noqa: F403
