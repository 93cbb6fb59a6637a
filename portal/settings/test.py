"""Settings for pytest: the same services as dev/CI, a separate data directory, fast hashing."""

import os
from pathlib import Path

os.environ.setdefault(
    "PORTAL_DATA_DIR", str(Path(__file__).resolve().parent.parent.parent / "var" / "test")
)

from portal.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
CACHES["default"]["KEY_PREFIX"] = "portal-test"  # noqa: F405
