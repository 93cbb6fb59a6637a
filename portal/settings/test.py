"""Settings for pytest: the same services as dev/CI, a separate data directory, fast hashing."""

import os
from pathlib import Path

from portal.settings.parallel import worker_redis_url

# Under ``pytest -n`` (make test's first phase) each worker has its own data directory and
# Redis database; PostgreSQL's test database is already per worker (pytest-django). Done
# once per worker process: the processes its tests start inherit the result through the
# environment (with PYTEST_XDIST_WORKER), and must not move it a second time.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_data = Path(__file__).resolve().parent.parent.parent / "var" / "test"
if XDIST_WORKER and os.environ.get("PORTAL_TEST_WORKER") != XDIST_WORKER:
    os.environ["PORTAL_TEST_WORKER"] = XDIST_WORKER
    os.environ["PORTAL_DATA_DIR"] = str(
        Path(os.environ.get("PORTAL_DATA_DIR", _data)) / XDIST_WORKER
    )
    if os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = worker_redis_url(
            os.environ["REDIS_URL"], int(XDIST_WORKER.removeprefix("gw"))
        )
os.environ.setdefault("PORTAL_DATA_DIR", str(_data))
# Tests run with DEBUG off, as production does, so they need a key: a fixed one that
# signs nothing outside the test databases.
os.environ.setdefault("SECRET_KEY", "test-only-key-signs-nothing-outside-the-test-databases")

from portal.settings.base import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Agents' own Redis users (control.agent_users) where a test turns them on
# (tests/test_agent_users.py): elsewhere a tick would make users on the shared server and
# add its queries to the counts that tests assert.
AGENT_REDIS_USERS = os.environ.get("AGENT_REDIS_USERS", "off")
DEBUG = False
CACHES["default"]["KEY_PREFIX"] = "portal-test"  # noqa: F405
# Tests make many requests quickly as a few users, from one address, run after run (the
# counts outlive a run in Redis); the rate-limit tests set their own limits.
API_THROTTLE_RATES = {"anon": "100000/minute", "user": "100000/minute"}
LOGIN_FAILURES_PER_ACCOUNT = LOGIN_FAILURES_PER_ADDRESS = 100_000
LOGIN_BACKOFF_AFTER_FAILURES = 100_000
NOTIFICATION_TESTS_PER_WINDOW = 100_000  # tests/notifications/test_limits.py sets its own
# Every tick reads the fair-share usage again: a reading kept from an earlier test's
# database would reorder the next test's tenants.
FAIR_SHARE_REFRESH_SECONDS = 0.0
# Tests mostly run inside a transaction that another thread's connection cannot see:
# the live summaries are built at commit, in the committing thread (the finisher thread
# has its own test, tests/portal/test_fanout.py).
LIVE_FINISH_IN_BACKGROUND = False
if XDIST_WORKER:
    # Redis pub/sub channels are global to a server, not per database: a worker's
    # live groups (``tenant-1``, ...) must not reach another worker's sockets.
    CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"asgi-{XDIST_WORKER}"  # noqa: F405
