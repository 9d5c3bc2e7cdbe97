"""The platform's settings surface: one reader with every default, two helpers.

In a project's settings::

    from jobs.conf import dramatiq_broker, redis_cache

    CACHES = {"default": redis_cache("redis://127.0.0.1:6379/1")}
    DRAMATIQ_BROKER = dramatiq_broker("redis://127.0.0.1:6379/0")

and in the platform's code ``jobs_settings.JOBS_MAX_RETRIES`` reads the project's
value or the default of ``jobs.conf.defaults`` (the way DRF's ``api_settings``
does). Values are read on each access, so ``override_settings`` works.

This module is imported by settings files: it must not touch Django's settings or
apps at import time.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from jobs.conf.broker import MIDDLEWARE, dramatiq_broker, redis_cache
from jobs.conf.defaults import DEFAULTS, HIDDEN

__all__ = ["MIDDLEWARE", "JobsSettings", "dramatiq_broker", "jobs_settings", "redis_cache"]

_UNSET = object()


class JobsSettings:
    """``jobs_settings.NAME``: the project's ``settings.NAME`` or the platform's default."""

    JOBS_CACHE: str
    JOBS_MAX_RETRIES: int
    JOBS_MIN_BACKOFF_MS: int
    JOBS_MAX_BACKOFF_MS: int
    JOBS_TIME_LIMIT_MS: int
    JOBS_MAX_PAYLOAD_BYTES: int
    JOBS_OUTBOX_RELAY_INTERVAL_MS: int
    JOBS_OUTBOX_GRACE_MS: int
    JOBS_OUTBOX_WAIT_REPLICAS: int
    JOBS_OUTBOX_WAIT_TIMEOUT_MS: int
    JOBS_LEDGER_ENABLED: bool
    JOBS_LEDGER_FLUSH_MS: int
    JOBS_LEDGER_PREPARED: bool
    JOBS_KEEP_FAILED: int
    JOBS_KEEP_SUCCEEDED_DAYS: int
    JOBS_CONTROL_REFRESH_MS: int
    JOBS_CANCEL_GRACE_MS: int
    JOBS_PROGRESS_INTERVAL_MS: int
    JOBS_UNKNOWN_ACTOR_WAIT_MS: int
    JOBS_PAUSE_RECHECK_MS: int
    JOBS_FAIR_QUEUEING: bool
    JOBS_LOCK_WAIT_WARNING_MS: int
    JOBS_CACHE_LEASE_MS: int
    JOBS_DEDUP_TTL_MS: int
    JOBS_SCHEDULE_TZ: str
    JOBS_PERIODIC_SKIP_AFTER_S: int
    JOBS_PERIODIC: tuple[str, ...] | list[str]
    JOBS_WATCHDOG_CRON: str
    JOBS_PRUNE_CRON: str
    JOBS_REPORT_CRON: str
    JOBS_REPORT_CATCH_UP_HOURS: int
    JOBS_WATCHDOG_GRACE_S: int
    JOBS_WATCHDOG_LOCK_MAX_AGE_S: int
    JOBS_WATCHDOG_QUEUE_STALL_MINUTES: int
    JOBS_WATCHDOG_MAIL_EVERY_MINUTES: int
    JOBS_METRICS_TOKEN: str
    JOBS_METRICS_ALLOWED_IPS: tuple[str, ...] | list[str]
    JOBS_MAIL_RECIPIENTS: tuple[str, ...] | list[str]
    JOBS_SITE_URL: str
    JOBS_SCHEDULER_SPEED: float
    JOBS_SCHEDULER_EPOCH: float

    def __getattr__(self, name: str) -> Any:
        knob = DEFAULTS.get(name) or HIDDEN.get(name)
        if knob is None:
            raise AttributeError(f"the jobs platform has no setting {name!r}")
        value = getattr(settings, name, _UNSET)
        return knob.value_of_default(settings) if value is _UNSET else value


jobs_settings = JobsSettings()
