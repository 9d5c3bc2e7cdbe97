"""Settings for the whole project, read from the environment.

Every variable has a local default that works out of the box (SQLite under
``var/``, Redis on localhost); a malformed value stops start-up with a message
naming the variable. See docs/reference/configuration.md.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from email.utils import parseaddr
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dj_database_url
import django
from django.core.exceptions import ImproperlyConfigured

from jobs.conf import dramatiq_broker, redis_cache
from jobs.conf.redis_urls import split_redis_url
from jobs.conf.sentinels import sentinel_config
from project.devservices import load_dev_services
from project.env import env_bool, env_int, env_list, env_rate, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))
# A shell beside a running bin/dev finds its private Redis (project/devservices.py);
# settings that import these (the tests', the bench's) never do.
if os.environ.get("DJANGO_SETTINGS_MODULE", __name__) == __name__:
    load_dev_services(VAR_DIR)

# Prometheus multiprocess mode: every process (web, workers, scheduler) writes
# its metrics here and /metrics sums them. prometheus_client reads this when it
# is first imported, which is after settings load in every entry point.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "prometheus"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)

# --- Core --------------------------------------------------------------------

INSECURE_DEV_SECRET_KEY = "django-insecure-dev-only-key-do-not-use-in-production"
DEBUG = env_bool("DJANGO_DEBUG", True)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", INSECURE_DEV_SECRET_KEY)
# Django's own bar for a key (check security.W009): 50 characters, 5 different ones.
if not DEBUG and (
    SECRET_KEY == INSECURE_DEV_SECRET_KEY
    or SECRET_KEY.startswith("django-insecure")
    or len(SECRET_KEY) < 50
    or len(set(SECRET_KEY)) < 5
):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be a strong secret (50+ characters, not the development "
        "key) when DJANGO_DEBUG is off; make one with: python -c 'import secrets; "
        "print(secrets.token_urlsafe(50))'"
    )
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # the platform before django_dramatiq (jobs/apps.py says why)
    "jobs",
    "django_dramatiq",
    "accounts",
]
if importlib.util.find_spec("django.tasks") is None:
    # Django 5.2: the django-tasks backport provides django.tasks' API as an app.
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_dramatiq"), "django_tasks")

MIDDLEWARE = [
    "jobs.observability.logcontext.RequestIdMiddleware",
    # NUL in a path or query string: a 400 before PostgreSQL could make it a 500
    "jobs.http.nul.RejectNulMiddleware",
    # a form posted in another charset than UTF-8: a 400 before the CSRF check reads it
    "jobs.http.charset.RejectForeignFormCharsetMiddleware",
    # a lost database connection (PostgreSQL restarting) is a 503, not a 500
    "jobs.observability.unavailable.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

if not DEBUG:
    # Serves collected static files from gunicorn; runserver does it in DEBUG. After
    # SecurityMiddleware (WhiteNoise's own advice), so static files get HSTS,
    # nosniff and the HTTPS redirect like every page.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
        "whitenoise.middleware.WhiteNoiseMiddleware",
    )
    # Static files are this site's: no Access-Control-Allow-Origin: * on them.
    WHITENOISE_ALLOW_ALL_ORIGINS = False

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
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

# --- Database ----------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")
try:
    _database = dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is malformed: {exc}") from None
if _database["ENGINE"] == "django.db.backends.sqlite3":
    # Many worker threads write job state at once. Django's SQLite defaults fail
    # such writes with "database is locked" (see DESIGN.md); WAL lets readers run
    # beside the writer, IMMEDIATE takes the write lock at BEGIN so transactions
    # queue on the busy timeout instead of failing on lock upgrade.
    Path(_database["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    _database["CONN_MAX_AGE"] = 0
    _database["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: broker and cache -------------------------------------------------

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER_REDIS_URL, CACHE_REDIS_URL = split_redis_url("REDIS_URL", REDIS_URL)

# With Sentinel, REDIS_URL's host is ignored: the primary is whichever server the
# Sentinels name now (docs/howto/several-hosts.md).
REDIS_SENTINEL = sentinel_config(
    "REDIS_SENTINELS",
    env_str("REDIS_SENTINELS", ""),
    "REDIS_SENTINEL_MASTER",
    env_str("REDIS_SENTINEL_MASTER", ""),
)

CACHES = {
    "default": redis_cache(
        CACHE_REDIS_URL,
        sentinels=REDIS_SENTINEL[0] if REDIS_SENTINEL else None,
        sentinel_master=REDIS_SENTINEL[1] if REDIS_SENTINEL else None,
        key_prefix="app",
    )
}

# --- Jobs (Dramatiq) ---------------------------------------------------------

# Attempts in total = 1 + JOBS_MAX_RETRIES; delays double from the minimum:
# 5 s, 10 s, 20 s, ... capped at JOBS_MAX_BACKOFF_MS.
JOBS_MAX_RETRIES = env_int("JOBS_MAX_RETRIES", 2, minimum=0)
JOBS_MIN_BACKOFF_MS = env_int("JOBS_MIN_BACKOFF_MS", 5_000, minimum=1)
JOBS_MAX_BACKOFF_MS = env_int("JOBS_MAX_BACKOFF_MS", 3_600_000, minimum=1)
# Default time limit of one attempt; actors may set their own ``time_limit``.
JOBS_TIME_LIMIT_MS = env_int("JOBS_TIME_LIMIT_MS", 10 * 60_000, minimum=1)

# Outbox relay (in every worker process): how often it looks for unsent rows,
# and how long after commit a row is left to its committer. 0 turns it off.
JOBS_OUTBOX_RELAY_INTERVAL_MS = env_int("JOBS_OUTBOX_RELAY_INTERVAL_MS", 2000, minimum=0)
JOBS_OUTBOX_GRACE_MS = env_int("JOBS_OUTBOX_GRACE_MS", 2000, minimum=0)
# A row is marked sent once this many replicas confirmed its message (WAIT), so
# a Sentinel failover cannot lose it: on by default under Sentinel, where a
# replica exists by design. The timeout bounds what a request waits for it.
JOBS_OUTBOX_WAIT_REPLICAS = env_int(
    "JOBS_OUTBOX_WAIT_REPLICAS", 1 if REDIS_SENTINEL else 0, minimum=0
)
JOBS_OUTBOX_WAIT_TIMEOUT_MS = env_int("JOBS_OUTBOX_WAIT_TIMEOUT_MS", 500, minimum=1)

# Messages larger than this are refused when sent (pass ids, not data).
JOBS_MAX_PAYLOAD_BYTES = env_int("JOBS_MAX_PAYLOAD_BYTES", 64 * 1024, minimum=256)

# Idle workers start a new job within milliseconds (the producer pushes a
# wake-up token an idle consumer waits on); off = Dramatiq's polling with backoff.
JOBS_INSTANT_WAKEUP = env_bool("JOBS_INSTANT_WAKEUP", True)

# A worker silent this long is presumed dead: its in-flight messages are
# redelivered and its run_once claims taken over. Every worker process beats
# and forces the broker's maintenance from a thread every 2 s (jobs.broker.workers),
# so a killed worker's jobs are back within this + 2 s. Why 15 s, measured on 2
# shared cores (tests/e2e/test_crash_safety.py soak, 3 workers under load, 10
# SIGKILLs): a live worker's heartbeat was never older than 0.3 s (2 s at worst
# from the thread alone), so 15 s leaves 7x the thread's interval for GC pauses,
# swapping and Redis stalls before a live worker could be taken for dead, while
# a crashed worker's messages were back in their queues 15.1-16.2 s after the kill
# (p50 15.6 s). Dramatiq's 60 s would only make every crash a minute slower.
JOBS_HEARTBEAT_TIMEOUT_MS = env_int("JOBS_HEARTBEAT_TIMEOUT_MS", 15_000, minimum=1000)

# Job ledger: every message's state in the database (jobs.Job, shown in the admin).
JOBS_LEDGER_ENABLED = env_bool("JOBS_LEDGER_ENABLED", True)
# Events are written in batches by a background thread every this many ms;
# 0 writes each event at once in the thread that saw it.
JOBS_LEDGER_FLUSH_MS = env_int("JOBS_LEDGER_FLUSH_MS", 200, minimum=0)
# On PostgreSQL the writer prepares its statements (jobs.ledger.upsert.batch_cursor);
# 0 behind a pooler that cannot keep prepared statements (PgBouncer < 1.22 in
# transaction mode, or max_prepared_statements = 0).
JOBS_LEDGER_PREPARED = env_bool("JOBS_LEDGER_PREPARED", True)
# Retention (python manage.py prunejobs; periodic once the scheduler runs).
JOBS_KEEP_FAILED = env_int("JOBS_KEEP_FAILED", 1000, minimum=0)
JOBS_KEEP_SUCCEEDED_DAYS = env_int("JOBS_KEEP_SUCCEEDED_DAYS", 7, minimum=0)
# Workers re-read paused queues and cancelled jobs this often (not per job).
JOBS_CONTROL_REFRESH_MS = env_int("JOBS_CONTROL_REFRESH_MS", 1000, minimum=0)
# A paused queue's messages come back this often to see if it was resumed.
JOBS_PAUSE_RECHECK_MS = env_int("JOBS_PAUSE_RECHECK_MS", 5_000, minimum=10)

# --- Consistency toolkit (jobs.consistency: locks, cache, dedup) -------------------

JOBS_LOCK_WAIT_WARNING_MS = env_int("JOBS_LOCK_WAIT_WARNING_MS", 1000, minimum=0)
# How long cache readers wait for the one caller loading a missing key.
JOBS_CACHE_LEASE_MS = env_int("JOBS_CACHE_LEASE_MS", 5000, minimum=1)
# Safety expiry of a send_unique() key if its job never finishes.
JOBS_DEDUP_TTL_MS = env_int("JOBS_DEDUP_TTL_MS", 3_600_000, minimum=1)
# The mail provider's budget: welcome emails per second across all workers.
WELCOME_EMAIL_RATE_PER_SECOND = env_int("WELCOME_EMAIL_RATE_PER_SECOND", 10, minimum=1)
USER_PROFILE_CACHE_TTL = env_int("USER_PROFILE_CACHE_TTL", 300, minimum=1)

# --- Scheduling (python manage.py runscheduler) ---------------------------------

JOBS_SCHEDULE_TZ = env_str("JOBS_SCHEDULE_TZ", env_str("TIME_ZONE", "UTC"))
try:
    ZoneInfo(JOBS_SCHEDULE_TZ)
except (ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(
        f"JOBS_SCHEDULE_TZ is not a time zone: {JOBS_SCHEDULE_TZ!r}"
    ) from None
# A periodic message still waiting this long after its tick is skipped.
JOBS_PERIODIC_SKIP_AFTER_S = env_int("JOBS_PERIODIC_SKIP_AFTER_S", 3600, minimum=1)
# Tests only: run the scheduler's clock this many times faster from this epoch.
JOBS_SCHEDULER_SPEED = float(env_int("JOBS_SCHEDULER_SPEED", 1, minimum=1))
JOBS_SCHEDULER_EPOCH = float(env_int("JOBS_SCHEDULER_EPOCH", 0, minimum=0))
# "0 6 * * *": at 06:00 every day (in JOBS_SCHEDULE_TZ).
JOBS_REPORT_CRON = env_str("REPORT_CRON", "0 6 * * *")
# A report missed while no scheduler ran is produced when one starts within this window.
JOBS_REPORT_CATCH_UP_HOURS = env_int("REPORT_CATCH_UP_HOURS", 12, minimum=0)
# "* * * * *": every minute.
JOBS_WATCHDOG_CRON = env_str("WATCHDOG_CRON", "* * * * *")
# "30 3 * * *": at 03:30 every day.
JOBS_PRUNE_CRON = env_str("PRUNE_CRON", "30 3 * * *")
# Watchdog thresholds.
JOBS_WATCHDOG_GRACE_S = env_int("WATCHDOG_GRACE_S", 60, minimum=0)
JOBS_WATCHDOG_LOCK_MAX_AGE_S = env_int("WATCHDOG_LOCK_MAX_AGE_S", 900, minimum=1)
JOBS_WATCHDOG_QUEUE_STALL_MINUTES = env_int("WATCHDOG_QUEUE_STALL_MINUTES", 5, minimum=1)
# One alert mail per incident kind within this many minutes.
JOBS_WATCHDOG_MAIL_EVERY_MINUTES = env_int("WATCHDOG_MAIL_EVERY_MINUTES", 60, minimum=1)

# The platform's Redis broker with every middleware it relies on, in order
# (jobs/conf/broker.py says why each is there).
DRAMATIQ_BROKER = dramatiq_broker(
    BROKER_REDIS_URL,
    sentinels=REDIS_SENTINEL[0] if REDIS_SENTINEL else None,
    sentinel_master=REDIS_SENTINEL[1] if REDIS_SENTINEL else None,
    heartbeat_timeout_ms=JOBS_HEARTBEAT_TIMEOUT_MS,
    instant_wakeup=JOBS_INSTANT_WAKEUP,
)

# Django's Tasks framework (@task functions) runs on the same workers as the
# actors; results come from the job ledger. OPTIONS take Dramatiq's actor
# options (unset: the JOBS_* defaults above). See docs/howto/django-tasks.md.
TASKS = {
    "default": {
        "BACKEND": "jobs.tasks_framework.backend.DramatiqBackend",
        "QUEUES": ["default", "exports"],
        "OPTIONS": {
            "result_max_bytes": env_int("JOBS_TASK_RESULT_MAX_BYTES", 64 * 1024, minimum=2),
        },
    }
}

# --- Email -------------------------------------------------------------------

# Files under var/mail/ in development; SMTP in production (Django 6.1's deploy
# check refuses the development-only backends there).
_EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    f"django.core.mail.backends.{'filebased' if DEBUG else 'smtp'}.EmailBackend",
)
_EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
_EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
_EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
_EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
# An SMTP relay that wants a login: STARTTLS (usually port 587) or TLS from the
# start (465), never both.
_EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
_EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
_EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
_EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if _EMAIL_USE_TLS and _EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL exclude each other: set one")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Signup <noreply@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
# Site admins get an email per server error (bounded: jobs.observability.errorreports):
# "Ada <ada@example.com>, ops@example.com". None unless set.
_ADMINS = env_list("DJANGO_ADMINS", [])
# The daily report and watchdog alerts (the platform's JOBS_MAIL_RECIPIENTS); in
# development they land in var/mail/ like every mail.
JOBS_MAIL_RECIPIENTS = env_list(
    "JOBS_MAIL_RECIPIENTS",
    [parseaddr(item)[1] for item in _ADMINS] or (["admin@localhost"] if DEBUG else []),
)
if django.VERSION >= (6, 1):
    # Django 6.1 replaces the EMAIL_* settings with MAILERS (and refuses both at
    # once), and takes ADMINS as address strings. The environment stays the same.
    if _EMAIL_BACKEND.endswith(".smtp.EmailBackend"):
        _mailer_options: dict[str, object] = {
            "host": _EMAIL_HOST,
            "port": _EMAIL_PORT,
            "timeout": _EMAIL_TIMEOUT,
            "username": _EMAIL_HOST_USER,
            "password": _EMAIL_HOST_PASSWORD,
            "use_tls": _EMAIL_USE_TLS,
            "use_ssl": _EMAIL_USE_SSL,
        }
    elif _EMAIL_BACKEND.endswith(".filebased.EmailBackend"):
        _mailer_options = {"file_path": _EMAIL_FILE_PATH}
    else:
        _mailer_options = {}
    MAILERS = {"default": {"BACKEND": _EMAIL_BACKEND, "OPTIONS": _mailer_options}}
    ADMINS: list[str] | list[tuple[str, str]] = _ADMINS
else:
    EMAIL_BACKEND = _EMAIL_BACKEND
    EMAIL_FILE_PATH = _EMAIL_FILE_PATH
    EMAIL_HOST = _EMAIL_HOST
    EMAIL_PORT = _EMAIL_PORT
    EMAIL_TIMEOUT = _EMAIL_TIMEOUT
    EMAIL_HOST_USER = _EMAIL_HOST_USER
    EMAIL_HOST_PASSWORD = _EMAIL_HOST_PASSWORD
    EMAIL_USE_TLS = _EMAIL_USE_TLS
    EMAIL_USE_SSL = _EMAIL_USE_SSL
    ADMINS = [parseaddr(item) for item in _ADMINS]
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")
# Links in the platform's daily report and alert mails.
JOBS_SITE_URL = SITE_URL

# --- Signup ------------------------------------------------------------------

SIGNUP_RATE_LIMIT = env_rate("SIGNUP_RATE_LIMIT", "10/m")
# Bodies larger than this are refused with 400 before parsing (hostile input).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 64 * 1024, minimum=1024)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Signed-up users log in on their own page; staff use the admin's (both rate limited).
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "accounts:account"
LOGOUT_REDIRECT_URL = "accounts:login"
# Login attempts per (client IP, user name), and five times that per IP; "off" disables.
LOGIN_RATE_LIMIT = env_rate("LOGIN_RATE_LIMIT", "10/m")

# --- I18n, static ------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Production hardening (active when DEBUG is off) ---------------------------

if not DEBUG:
    # Only behind a proxy that sets X-Forwarded-Proto (and drops a client's): with
    # gunicorn exposed directly (docker-compose), a client could claim https.
    if env_bool("DJANGO_TRUST_X_FORWARDED_PROTO", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    if not SECURE_SSL_REDIRECT:
        # Turned off on purpose (plain HTTP in docker-compose, or TLS ends at a
        # proxy that redirects): check --deploy's W008 exists to catch forgetting.
        SILENCED_SYSTEM_CHECKS = ["security.W008"]
    # Probes and scrapers talk plain HTTP inside the cluster.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# --- Metrics -------------------------------------------------------------------

# /metrics: loopback only in DEBUG; otherwise a bearer token or an allowlist.
JOBS_METRICS_TOKEN = env_str("METRICS_TOKEN", "")
JOBS_METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", [])
for _network in JOBS_METRICS_ALLOWED_IPS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"METRICS_ALLOWED_IPS has an entry that is not an address or network: {_network!r}"
        ) from None

# --- Logging -----------------------------------------------------------------

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
# JSON lines in production, readable lines in development.
LOG_FORMAT = env_str("LOG_FORMAT", "plain" if DEBUG else "json")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be 'plain' or 'json', got {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "context": {"()": "jobs.observability.logcontext.ContextFilter"},
        # Every handler: Dramatiq logs messages with their arguments (passwords too).
        "redact": {"()": "jobs.observability.logredaction.RedactFilter"},
        "require_debug_false": {"()": "django.utils.log.RequireDebugFalse"},
    },
    "formatters": {
        "plain": {
            "()": "jobs.observability.logcontext.PlainFormatter",
            "format": "%(asctime)s %(levelname)s [%(process)d %(threadName)s] %(name)s: "
            "%(message)s",
        },
        "json": {"()": "jobs.observability.logcontext.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["redact", "context"],
        },
        # Server errors by mail to ADMINS (none unless set), with DEBUG off:
        # credentials masked, one email per kind of error per 10 minutes.
        "mail_admins": {
            "class": "jobs.observability.errorreports.ThrottledAdminEmailHandler",
            "level": "ERROR",
            "filters": ["require_debug_false", "redact"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Replaces Django's default handlers of this logger (console and an
        # unbounded mail_admins); records still reach the root's console.
        "django": {"handlers": ["mail_admins"], "level": "INFO"},
        # A bad Host header, too many fields, a body too large: a client's doing,
        # not a bug. Logged, never mailed (they would spend the mail budget).
        "django.security": {"handlers": ["console"], "propagate": False},
    },
}
# Error reports (the debug page, error emails) mask credentials inside values too:
# a password in REDIS_URL or DATABASE_URL has an innocent setting name.
DEFAULT_EXCEPTION_REPORTER_FILTER = "jobs.observability.errorreports.SecretsReporterFilter"
DEFAULT_EXCEPTION_REPORTER = "jobs.observability.errorreports.SecretsExceptionReporter"
