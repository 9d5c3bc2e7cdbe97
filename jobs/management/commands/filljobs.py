"""``python manage.py filljobs --count N``: fill the job ledger with fake rows, fast.

For benchmarks of the admin on a large table (1,000,000 rows in about a
minute on SQLite). Rows look like a real mix: mostly succeeded, some failed,
a few waiting, over several actors and queues, enqueued over the last days.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from jobs.ledger import states
from jobs.ledger.writer import TERMINAL
from jobs.models import Job, JobReference

ACTORS = (("send_welcome_email", "emails"), ("daily_report", "reports"), ("watchdog", "default"))
# Out of every 100 rows: 89 succeeded, 7 failed, 1 skipped, 3 enqueued.
STATE_MIX = [states.SUCCEEDED] * 89 + [states.FAILED] * 7 + [states.SKIPPED] + [states.ENQUEUED] * 3
# Durations spread over the histogram's buckets, so percentiles have work to do.
DURATIONS_MS = (3, 8, 12, 20, 35, 60, 90, 150, 400, 1_200, 2_500)


class Command(BaseCommand):
    help = "Insert N fake job ledger rows in batches (benchmarks of the admin)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--batch", type=int, default=5_000)

    def handle(self, *args: Any, count: int, batch: int, **options: Any) -> None:
        now = datetime.now(UTC)
        done = 0
        while done < count:
            size = min(batch, count - done)
            # One transaction per batch: SQLite commits are the expensive part.
            with transaction.atomic():
                jobs = Job.objects.bulk_create(
                    [self._row(done + i, count, now) for i in range(size)], batch_size=size
                )
                JobReference.objects.bulk_create(
                    [
                        JobReference(job=job, subject=f"auth.user:{job.args[0]}")
                        for job in jobs
                        if job.actor_name == "send_welcome_email"
                    ],
                    batch_size=size,
                )
            done += size
            if done % (batch * 20) == 0 or done == count:
                self.stdout.write(f"{done:,}/{count:,} rows")

    @staticmethod
    def _row(index: int, count: int, now: datetime) -> Job:
        actor, queue = ACTORS[index % len(ACTORS)]
        state = STATE_MIX[index % len(STATE_MIX)]
        # Oldest first, so ids and enqueue times grow together as in real life.
        enqueued = now - timedelta(seconds=(count - index) * 0.5)
        finished = state in states.TERMINAL_STATES
        ran = state in (states.SUCCEEDED, states.FAILED)
        duration = DURATIONS_MS[(index * 7) % len(DURATIONS_MS)]
        # Every 20th succeeded job needed a retry.
        attempts = (2 if index % 20 == 0 else 1) if ran else 0
        return Job(
            message_id=str(uuid.uuid4()),
            actor_name=actor,
            queue_name=queue,
            state=state,
            progress=TERMINAL if finished else 2,
            attempts=attempts,
            max_attempts=3,
            args=[index],
            enqueued_at=enqueued,
            started_at=enqueued if ran else None,
            finished_at=enqueued + timedelta(milliseconds=duration) if finished else None,
            duration_ms=duration if ran else None,
            skip_reason="age limit" if state == states.SKIPPED else "",
            error_type="SMTPServerDisconnected" if state == states.FAILED else "",
            error_message="Connection unexpectedly closed" if state == states.FAILED else "",
        )
