"""Periodic jobs of the platform (autodiscovered by rundramatiq and runscheduler)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from zoneinfo import ZoneInfo

import dramatiq
from django.conf import settings
from django.utils import timezone
from dramatiq.middleware import CurrentMessage
from periodiq import cron

from jobs import checkpoints
from jobs.errors import TransientJobError
from jobs.idempotency import once_atomic
from jobs.reports import report_generate, report_send
from jobs.retention import prune
from jobs.scheduling import current_tick
from jobs.watchdog import run_watchdog

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
    prune(
        keep_failed=settings.JOBS_KEEP_FAILED,
        keep_succeeded_days=settings.JOBS_KEEP_SUCCEEDED_DAYS,
    )


# An example of a multi-step job: each step is checkpointed, so a retry resumes
# after the last finished step; the final effect commits with its idempotency key
# (once_atomic), so a redelivered message cannot apply it twice. See README
# "Reliability"; the crash and outage tests drive it.
@dramatiq.actor(queue_name="default", max_retries=3, min_backoff=200)
def demo_pipeline(key: str, steps: int = 5, step_ms: int = 0, fail_at_step: int = 0) -> None:
    message = CurrentMessage.get_current_message()
    first_attempt = message is None or not message.options.get("retries")
    for step in range(1, steps + 1):
        if checkpoints.done(step):
            continue
        if step == fail_at_step and first_attempt:
            raise TransientJobError(f"step {step} of {steps} failed (demo)")
        time.sleep(step_ms / 1000)
        checkpoints.save(step, {"finished_at": timezone.now().isoformat()})
    with once_atomic(f"demo-pipeline:{key}") as first:
        if first:
            logger.info("demo_pipeline %s finished its %d steps", key, steps)
