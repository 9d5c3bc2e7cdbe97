"""Periodic jobs of the platform (autodiscovered by rundramatiq and runscheduler)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import dramatiq
from django.utils import timezone
from periodiq import cron

from jobs.conf import jobs_settings
from jobs.conf.checks import cron_problem
from jobs.errors import PermanentJobError
from jobs.ledger.retention import prune
from jobs.scheduling.reports import report_generate, report_send
from jobs.scheduling.scheduler import current_tick
from jobs.scheduling.watchdog import run_watchdog

logger = logging.getLogger(__name__)


def _when(name: str, cron_spec: object) -> dict[str, Any]:
    """``periodic=`` for a platform job that ``JOBS_PERIODIC`` lists; otherwise the
    actor still exists (``runreport``, the admin's "run now") but is not scheduled.

    A value that is wrong is not scheduled either: it must not crash start-up
    before check jobs.E005 can name it.
    """
    periodic = jobs_settings.JOBS_PERIODIC
    if not isinstance(periodic, (list, tuple)) or name not in periodic:
        return {}
    if cron_problem(cron_spec) is not None:
        return {}
    return {"periodic": cron(str(cron_spec))}


def _catch_up() -> timedelta:
    hours = jobs_settings.JOBS_REPORT_CATCH_UP_HOURS
    valid = isinstance(hours, int) and not isinstance(hours, bool) and hours >= 0
    return timedelta(hours=hours if valid else 0)  # else check jobs.E005 names it


# JOBS_REPORT_CRON, by default "0 6 * * *": at 06:00 every day, for the day before.
@dramatiq.actor(
    queue_name="periodic",
    catch_up=_catch_up(),
    time_limit=10 * 60_000,
    **_when("daily_report", jobs_settings.JOBS_REPORT_CRON),
)
def daily_report() -> None:
    tick = current_tick() or timezone.now()
    day = tick.astimezone(ZoneInfo(jobs_settings.JOBS_SCHEDULE_TZ)).date() - timedelta(days=1)
    report_send(report_generate(day))


# JOBS_WATCHDOG_CRON, by default "* * * * *": every minute.
@dramatiq.actor(
    queue_name="periodic", max_retries=0, **_when("watchdog", jobs_settings.JOBS_WATCHDOG_CRON)
)
def watchdog() -> None:
    run_watchdog()


# JOBS_PRUNE_CRON, by default "30 3 * * *": at 03:30 every day.
@dramatiq.actor(
    queue_name="periodic",
    time_limit=60 * 60_000,
    **_when("prune_jobs", jobs_settings.JOBS_PRUNE_CRON),
)
def prune_jobs() -> None:
    """Old ledger rows, sent outbox rows and checkpoints: what ``prunejobs`` deletes."""
    counts = prune(
        keep_failed=jobs_settings.JOBS_KEEP_FAILED,
        keep_succeeded_days=jobs_settings.JOBS_KEEP_SUCCEEDED_DAYS,
    )
    logger.info("Pruned %s", ", ".join(f"{n} {kind}" for kind, n in counts.items()))


@dramatiq.actor(queue_name="console", time_limit=60 * 60_000, store_return_value=True)
def bulk_action(
    action: str, query: str, username: str, ceiling: int, entry_id: int = 0
) -> dict[str, Any]:
    """The admin's "every matching job" action: see ``jobs.admin.bulk``."""
    from jobs.admin import bulk  # the admin, only where a bulk job is run

    try:
        return bulk.run(action, query, username, ceiling, entry_id)
    except PermissionError as exc:  # no such user, or no such right any more
        raise PermanentJobError(str(exc)) from exc
