from __future__ import annotations

from datetime import date, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from jobs.conf import jobs_settings
from jobs.scheduling.reports import report_generate, report_send


class Command(BaseCommand):
    help = (
        "Produce the daily report for one date (default: yesterday) and mail it to "
        "JOBS_MAIL_RECIPIENTS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--date", help="YYYY-MM-DD (default: yesterday in JOBS_SCHEDULE_TZ)")
        parser.add_argument("--no-mail", action="store_true", help="store it, do not mail it")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["date"]:
            try:
                day = date.fromisoformat(options["date"])
            except ValueError:
                raise CommandError(f"--date must be YYYY-MM-DD, got {options['date']!r}") from None
        else:
            now = timezone.now().astimezone(ZoneInfo(jobs_settings.JOBS_SCHEDULE_TZ))
            day = now.date() - timedelta(days=1)
        report = report_generate(day)
        self.stdout.write(report.text)
        if not options["no_mail"]:
            self.stdout.write(self._mailed(report_send(report)))

    def _mailed(self, sent: bool) -> str:
        # The count, not the addresses: the output may end up in a CI or cron log.
        count = len(jobs_settings.JOBS_MAIL_RECIPIENTS)
        if not count:
            return "Not mailed: JOBS_MAIL_RECIPIENTS is empty."
        if not sent:
            return "Already mailed earlier."
        return f"Mailed to {count} recipient{'s' if count > 1 else ''} (JOBS_MAIL_RECIPIENTS)."
