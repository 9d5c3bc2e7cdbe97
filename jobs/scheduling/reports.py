"""The daily report: yesterday's jobs and the product's figures, stored once per date and mailed.

The platform knows nothing of the product: an app adds its own figures (signups,
orders...) with ``@report_section``, usually in its ``reports.py`` imported from
``AppConfig.ready()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError
from django.db.models import Count, Q
from django.template.loader import render_to_string
from django.utils import timezone

from jobs.conf import jobs_settings
from jobs.consistency.cache import cache_stats
from jobs.consistency.idempotency import run_once
from jobs.consistency.locks import redis_lock
from jobs.ledger.figures import actor_figures
from jobs.models import DailyReport, Job, JobAttempt
from jobs.scheduling.operators import mail_operators

logger = logging.getLogger(__name__)

SectionFigure = Callable[[datetime, datetime], Any]
_sections: dict[str, tuple[str, SectionFigure]] = {}


def report_section(key: str, title: str) -> Callable[[SectionFigure], SectionFigure]:
    """Add a product figure to the daily report: ``figure(start, end)`` -> a JSON value.

    ``start``/``end`` bound the reported day in the schedule's time zone. Sections
    appear in the report in the order they were registered.
    """

    def register(figure: SectionFigure) -> SectionFigure:
        _sections[key] = (title, figure)
        return figure

    return register


def section_figures(start: datetime, end: datetime) -> list[dict[str, Any]]:
    return [
        {"key": key, "title": title, "value": figure(start, end)}
        for key, (title, figure) in _sections.items()
    ]


def day_bounds(day: date) -> tuple[datetime, datetime]:
    tz = ZoneInfo(jobs_settings.JOBS_SCHEDULE_TZ)
    start = datetime.combine(day, time.min, tzinfo=tz)
    return start, start + timedelta(days=1)


def report_figures(day: date) -> dict[str, Any]:
    """Every figure of the report for ``day``, in the schedule's time zone."""
    start, end = day_bounds(day)
    actors = {f.actor: asdict(f) for f in actor_figures(start, end)}
    retried = (
        Job.objects.filter(finished_at__gte=start, finished_at__lt=end, attempts__gt=1)
        .values("actor_name")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in retried:
        actors.setdefault(row["actor_name"], {"actor": row["actor_name"]})["retried"] = row["n"]
    for figures in actors.values():
        figures.setdefault("retried", 0)
        figures["succeeded"] = figures.get("finished", 0) - figures.get("failed", 0)
    reasons = list(
        JobAttempt.objects.filter(finished_at__gte=start, finished_at__lt=end)
        .values("error_type", "error_message")
        .annotate(n=Count("id"))
        .order_by("-n")[:5]
    )
    cache = cache_stats()
    hits = sum(ns["hits"] for ns in cache.values())
    misses = sum(ns["misses"] for ns in cache.values())
    return {
        "date": day.isoformat(),
        "sections": section_figures(start, end),
        "actors": [actors[name] for name in sorted(actors)],
        "top_failures": reasons,
        "jobs_failed": Job.objects.filter(
            Q(state="failed"), finished_at__gte=start, finished_at__lt=end
        ).count(),
        "cache": {
            "hits": hits,
            "misses": misses,
            "hit_ratio": None if not hits + misses else round(hits / (hits + misses), 4),
            "note": "cumulative counters since the cache statistics were last reset",
        },
    }


def report_generate(day: date) -> DailyReport:
    """Produce the report for ``day`` once: later calls return the stored one."""
    existing = DailyReport.objects.filter(date=day).first()
    if existing is not None:
        return existing
    # The lock keeps two concurrent deliveries from computing it twice; the
    # unique date settles it even if the lock was lost.
    with redis_lock(f"report:{day.isoformat()}", ttl=120, wait=30):
        existing = DailyReport.objects.filter(date=day).first()
        if existing is not None:
            return existing
        figures = report_figures(day)
        context = {"figures": figures, "site_url": jobs_settings.JOBS_SITE_URL}
        try:
            report = DailyReport.objects.create(
                date=day,
                figures=figures,
                text=render_to_string("jobs/emails/daily_report.txt", context),
                html=render_to_string("jobs/emails/daily_report.html", context),
            )
        except IntegrityError:
            return DailyReport.objects.get(date=day)
    logger.info("Daily report for %s produced", day.isoformat())
    return report


def report_send(report: DailyReport) -> bool:
    """Mail the report to ``JOBS_MAIL_RECIPIENTS`` once; True if it was sent now."""

    def send() -> None:
        mail_operators(f"Daily report {report.date.isoformat()}", report.text, html=report.html)

    if not jobs_settings.JOBS_MAIL_RECIPIENTS:
        # Not claimed: once someone is named, a run of the report mails it.
        logger.warning(
            "Daily report for %s not mailed: JOBS_MAIL_RECIPIENTS is empty", report.date.isoformat()
        )
        return False
    sent = run_once(f"daily-report-mail:{report.date.isoformat()}", send)
    if sent:
        DailyReport.objects.filter(pk=report.pk).update(emailed_at=timezone.now())
    return sent
