"""Settings for pytest: the same services as dev/CI, a separate data directory, fast hashing."""

import os
from pathlib import Path

os.environ.setdefault(
    "PORTAL_DATA_DIR", str(Path(__file__).resolve().parent.parent.parent / "var" / "test")
)
# Tests run with DEBUG off, as production does, so they need a key: a fixed one that
# signs nothing outside the test databases.
os.environ.setdefault("SECRET_KEY", "test-only-key-signs-nothing-outside-the-test-databases")

from portal.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
CACHES["default"]["KEY_PREFIX"] = "portal-test"  # noqa: F405
# Tests make many requests quickly as a few users, from one address, run after run (the
# counts outlive a run in Redis); the rate-limit tests set their own limits.
API_THROTTLE_RATES = {"anon": "100000/minute", "user": "100000/minute"}
LOGIN_FAILURES_PER_ACCOUNT = LOGIN_FAILURES_PER_ADDRESS = 100_000
# Every tick reads the fair-share usage again: a reading kept from an earlier test's
# database would reorder the next test's tenants.
FAIR_SHARE_REFRESH_SECONDS = 0.0
