"""Every setting of the platform with its default and what it does.

A project sets only what differs (``JOBS_MAX_RETRIES = 5`` in its settings);
``jobs.conf.jobs_settings`` reads the project's value or falls back to the
default here. ``jobs.conf.checks`` validates every value the project sets, and
``docs/reference/settings.md`` documents each name (a test keeps them in step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One setting: its default (or a function of the other settings), its kind, a floor."""

    default: Any
    kind: type | tuple[type, ...]
    doc: str
    minimum: int | None = None
    # "cron" and "tz" get a parse check on top of the type check.
    parse: str | None = None
    # For a list: the values it may hold.
    choices: tuple[str, ...] = ()

    def value_of_default(self, settings: Any) -> Any:
        if isinstance(self.default, Callable):  # type: ignore[arg-type]
            return self.default(settings)
        return self.default


def _schedule_tz(settings: Any) -> str:
    return str(getattr(settings, "TIME_ZONE", None) or "UTC")


def _admin_addresses(settings: Any) -> list[str]:
    # ADMINS holds (name, address) pairs before Django 6.0 and may hold plain
    # addresses since.
    return [
        item[1] if isinstance(item, (tuple, list)) else str(item)
        for item in getattr(settings, "ADMINS", [])
    ]


def _wait_replicas(settings: Any) -> int:
    # Under Sentinel a replica exists by design, and a failover must not lose a
    # message the outbox marked sent.
    options = getattr(settings, "DRAMATIQ_BROKER", {}).get("OPTIONS", {})
    return 1 if options.get("sentinels") else 0


_MS = (int,)
_BOOL = (bool,)

DEFAULTS: dict[str, Knob] = {
    # --- Where the platform's Redis is ---------------------------------------
    "JOBS_CACHE": Knob(
        "default",
        str,
        "Alias in ``CACHES`` of the django-redis cache the platform uses for locks, "
        "cache-aside, rate limits, dedup keys and health checks.",
    ),
    # --- Retries and limits ---------------------------------------------------
    "JOBS_MAX_RETRIES": Knob(
        2, int, "Retries after the first attempt (3 attempts in all).", minimum=0
    ),
    "JOBS_MIN_BACKOFF_MS": Knob(
        5_000, _MS, "First retry delay; each later one doubles it.", minimum=1
    ),
    "JOBS_MAX_BACKOFF_MS": Knob(3_600_000, _MS, "Ceiling of a retry delay.", minimum=1),
    "JOBS_TIME_LIMIT_MS": Knob(
        600_000, _MS, "Time limit of one attempt unless an actor sets ``time_limit``.", minimum=1
    ),
    "JOBS_MAX_PAYLOAD_BYTES": Knob(
        65_536, _MS, "Messages larger than this are refused when sent (pass ids).", minimum=256
    ),
    # --- Outbox: enqueue on commit that survives a broker outage -------------
    "JOBS_OUTBOX_RELAY_INTERVAL_MS": Knob(
        2_000,
        _MS,
        "How often each worker publishes outbox rows that could not be sent at commit; "
        "0 turns the relay off.",
        minimum=0,
    ),
    "JOBS_OUTBOX_GRACE_MS": Knob(
        2_000, _MS, "How long after commit a row is left to its committer.", minimum=0
    ),
    "JOBS_OUTBOX_WAIT_REPLICAS": Knob(
        _wait_replicas,
        int,
        "Replicas that must confirm a message (WAIT) before its outbox row is marked "
        "sent. Default: 1 when the broker uses Sentinel, else 0.",
        minimum=0,
    ),
    "JOBS_OUTBOX_WAIT_TIMEOUT_MS": Knob(
        500, _MS, "How long a request waits for those replicas.", minimum=1
    ),
    # --- Ledger (the admin's job list) ---------------------------------------
    "JOBS_LEDGER_ENABLED": Knob(True, _BOOL, "Record every job's state in the database."),
    "JOBS_LEDGER_FLUSH_MS": Knob(
        200,
        _MS,
        "Ledger events are written in batches this often; 0 writes each at once.",
        minimum=0,
    ),
    "JOBS_LEDGER_PREPARED": Knob(
        True,
        _BOOL,
        "Prepared statements on PostgreSQL; off behind a pooler that cannot keep them.",
    ),
    "JOBS_KEEP_FAILED": Knob(1_000, int, "Failed jobs kept by pruning.", minimum=0),
    "JOBS_KEEP_SUCCEEDED_DAYS": Knob(7, int, "Days succeeded jobs are kept.", minimum=0),
    "JOBS_CONTROL_REFRESH_MS": Knob(
        1_000, _MS, "How often workers re-read paused queues and cancelled jobs.", minimum=0
    ),
    "JOBS_CANCEL_GRACE_MS": Knob(
        10_000,
        _MS,
        "A running job asked to stop has this long to see it (``jobs.runtime.cancellation``) "
        "before it is stopped by force.",
        minimum=0,
    ),
    "JOBS_PROGRESS_INTERVAL_MS": Knob(
        1_000,
        _MS,
        "At most one progress write per job in this time (``jobs.runtime.progress``).",
        minimum=0,
    ),
    "JOBS_UNKNOWN_ACTOR_WAIT_MS": Knob(
        3_600_000,
        _MS,
        "A message for an actor a worker does not know (a rolling deploy) goes back to its "
        "queue for a worker that does, for this long after it was sent; then it is "
        "dead-lettered, with a ledger row.",
        minimum=0,
    ),
    "JOBS_PAUSE_RECHECK_MS": Knob(
        5_000, _MS, "How often a paused queue's messages come back to look.", minimum=10
    ),
    "JOBS_FAIR_QUEUEING": Knob(
        True,
        _BOOL,
        "Jobs of actors with a fairness_key take turns per key; False sends them as "
        "plain messages (before a rollback), while workers still run those waiting.",
    ),
    # --- Consistency toolkit -------------------------------------------------
    "JOBS_LOCK_WAIT_WARNING_MS": Knob(
        1_000, _MS, "A lock waited for longer than this is logged.", minimum=0
    ),
    "JOBS_CACHE_LEASE_MS": Knob(
        5_000, _MS, "How long cache readers wait for the one caller loading a key.", minimum=1
    ),
    "JOBS_DEDUP_TTL_MS": Knob(
        3_600_000, _MS, "Safety expiry of a ``send_unique()`` key.", minimum=1
    ),
    # --- Scheduling ------------------------------------------------------------
    "JOBS_SCHEDULE_TZ": Knob(
        _schedule_tz, str, "Time zone of cron expressions. Default: ``TIME_ZONE``.", parse="tz"
    ),
    "JOBS_PERIODIC_SKIP_AFTER_S": Knob(
        3_600,
        int,
        "A periodic message still waiting this long after its tick is skipped.",
        minimum=1,
    ),
    "JOBS_PERIODIC": Knob(
        ("watchdog", "prune_jobs", "daily_report"),
        (tuple, list),
        "Which of the platform's periodic jobs the scheduler runs.",
        choices=("watchdog", "prune_jobs", "daily_report"),
    ),
    "JOBS_WATCHDOG_CRON": Knob("* * * * *", str, "When the watchdog runs.", parse="cron"),
    "JOBS_PRUNE_CRON": Knob("30 3 * * *", str, "When old ledger rows are pruned.", parse="cron"),
    "JOBS_REPORT_CRON": Knob(
        "0 6 * * *", str, "When the daily report (of the day before) is mailed.", parse="cron"
    ),
    "JOBS_REPORT_CATCH_UP_HOURS": Knob(
        12, int, "A report missed while no scheduler ran is made within this window.", minimum=0
    ),
    "JOBS_WATCHDOG_GRACE_S": Knob(
        60, int, "Past its time limit plus this, a running job counts as stuck.", minimum=0
    ),
    "JOBS_WATCHDOG_LOCK_MAX_AGE_S": Knob(
        900, int, "A lock held longer than this is reported stale.", minimum=1
    ),
    "JOBS_WATCHDOG_QUEUE_STALL_MINUTES": Knob(
        5, int, "A queue with waiting jobs and no progress this long is reported.", minimum=1
    ),
    "JOBS_WATCHDOG_MAIL_EVERY_MINUTES": Knob(
        60, int, "At most one alert mail per kind of finding in this window.", minimum=1
    ),
    # --- Observability -------------------------------------------------------
    "JOBS_METRICS_TOKEN": Knob("", str, "Bearer token that may read ``/metrics`` (empty: none)."),
    "JOBS_METRICS_ALLOWED_IPS": Knob(
        (),
        (tuple, list),
        "Addresses or networks that may read ``/metrics`` without a token.",
        parse="networks",
    ),
    "JOBS_MAIL_RECIPIENTS": Knob(
        _admin_addresses,
        (tuple, list),
        "Addresses that get the daily report and watchdog alerts. Default: the "
        "addresses of ``ADMINS``.",
    ),
    "JOBS_SITE_URL": Knob(
        "", str, "Absolute URL of the site, for links in the daily report and alert mails."
    ),
}

# Knobs of the test suite, not part of the public surface: the scheduler's clock
# runs this many times faster from this epoch.
HIDDEN: dict[str, Knob] = {
    "JOBS_SCHEDULER_SPEED": Knob(1.0, (int, float), "", minimum=1),
    "JOBS_SCHEDULER_EPOCH": Knob(0.0, (int, float), "", minimum=0),
}
