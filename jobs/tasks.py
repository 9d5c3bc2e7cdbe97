"""Periodic jobs of the platform (autodiscovered by rundramatiq and runscheduler)."""

from __future__ import annotations

import logging
from datetime import timedelta
from zoneinfo import ZoneInfo

import dramatiq
from django.conf import settings
from django.utils import timezone
from periodiq import cron

from jobs.ledger.retention import prune
from jobs.scheduling.reports import report_generate, report_send
from jobs.scheduling.scheduler import current_tick
from jobs.scheduling.watchdog import run_watchdog

logger = logging.getLogger(__name__)


# REPORT_CRON, by default "0 6 * * *": at 06:00 every day, for the day before.
@dramatiq.actor(
    queue_name="periodic",
    periodic=cron(settings.REPORT_CRON),
    catch_up=timedelta(hours=settings.REPORT_CATCH_UP_HOURS),
    time_limit=10 * 60_000,
)
def daily_report() -> None:
    tick = current_tick() or timezone.now()
    day = tick.astimezone(ZoneInfo(settings.JOBS_SCHEDULE_TZ)).date() - timedelta(days=1)
    report_send(report_generate(day))


# WATCHDOG_CRON, by default "* * * * *": every minute.
@dramatiq.actor(queue_name="periodic", periodic=cron(settings.WATCHDOG_CRON), max_retries=0)
def watchdog() -> None:
    run_watchdog()


# PRUNE_CRON, by default "30 3 * * *": at 03:30 every day.
@dramatiq.actor(queue_name="periodic", periodic=cron(settings.PRUNE_CRON), time_limit=60 * 60_000)
def prune_jobs() -> None:
    """Old ledger rows, sent outbox rows and checkpoints: what ``prunejobs`` deletes."""
    counts = prune(
        keep_failed=settings.JOBS_KEEP_FAILED,
        keep_succeeded_days=settings.JOBS_KEEP_SUCCEEDED_DAYS,
    )
    logger.info("Pruned %s", ", ".join(f"{n} {kind}" for kind, n in counts.items()))
