"""The embedded default for a laptop: what ``make run`` selects explicitly.

DEBUG is on unless the environment says otherwise, so no SECRET_KEY is needed (a random
local one is kept in the data directory) and ALLOWED_HOSTS must stay loopback-only;
``portal.settings.safety`` refuses anything else.  Set before ``base`` reads it.
"""

import os

os.environ.setdefault("DEBUG", "1")

from portal.settings.base import *  # noqa: F403
