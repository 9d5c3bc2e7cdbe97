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
from jobs.models import Job

ACTORS = (("send_welcome_email", "emails"), ("daily_report", "reports"), ("watchdog", "default"))
# Out of every 100 rows: 90 succeeded, 7 failed, 3 enqueued.
STATE_MIX = [states.SUCCEEDED] * 90 + [states.FAILED] * 7 + [states.ENQUEUED] * 3


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
                Job.objects.bulk_create(
                    [self._row(done + i, count, now) for i in range(size)], batch_size=size
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
        return Job(
            message_id=str(uuid.uuid4()),
            actor_name=actor,
            queue_name=queue,
            state=state,
            progress=TERMINAL if finished else 2,
            attempts=1 if finished else 0,
            max_attempts=3,
            args=[index],
            enqueued_at=enqueued,
            started_at=enqueued if finished else None,
            finished_at=enqueued + timedelta(milliseconds=12) if finished else None,
            duration_ms=12 if finished else None,
            error_type="SMTPServerDisconnected" if state == states.FAILED else "",
            error_message="Connection unexpectedly closed" if state == states.FAILED else "",
        )
