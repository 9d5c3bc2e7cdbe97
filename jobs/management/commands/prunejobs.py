from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.conf import jobs_settings
from jobs.ledger.retention import prune


class Command(BaseCommand):
    help = (
        "Delete old job ledger rows: keep the newest JOBS_KEEP_FAILED failed jobs and the "
        "succeeded, skipped and cancelled jobs younger than JOBS_KEEP_SUCCEEDED_DAYS; delete "
        "outbox rows "
        "sent before that horizon and older checkpoints of jobs no longer kept. Works in "
        "batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--keep-failed",
            type=int,
            default=jobs_settings.JOBS_KEEP_FAILED,
            help="failed jobs to keep (default: JOBS_KEEP_FAILED=%(default)s)",
        )
        parser.add_argument(
            "--keep-days",
            type=int,
            default=jobs_settings.JOBS_KEEP_SUCCEEDED_DAYS,
            help="days to keep succeeded and skipped jobs, sent outbox rows and checkpoints "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--batch", type=int, default=1000, help="rows per delete (default: %(default)s)"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="only count what would be deleted"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def report(kind: str, done: int, total: int) -> None:
            self.stdout.write(f"  {kind}: deleted {done:,}/{total:,}")

        counts = prune(
            keep_failed=options["keep_failed"],
            keep_succeeded_days=options["keep_days"],
            batch=options["batch"],
            dry_run=options["dry_run"],
            progress=report,
        )
        verb = "would delete" if options["dry_run"] else "deleted"
        summary = ", ".join(f"{n:,} {kind}" for kind, n in counts.items())
        self.stdout.write(self.style.SUCCESS(f"prunejobs {verb}: {summary}"))
