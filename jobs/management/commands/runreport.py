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
            sent = report_send(report)
            self.stdout.write("Mailed to the admins." if sent else "Already mailed earlier.")
