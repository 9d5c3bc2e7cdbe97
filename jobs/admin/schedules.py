"""The admin's view of periodic jobs: cron text, next and last run, "run now"."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import dramatiq
import pendulum

from jobs.broker import redis_broker
from jobs.models import Job
from jobs.scheduling.scheduler import claim_tick, default_clock, periodic_actors, tick_key

RUN_NOW_GUARD_SECONDS = 10


@dataclass(frozen=True)
class ScheduleRow:
    actor: str
    queue: str
    cron: str
    next_run: datetime
    last_run: datetime | None
    last_state: str | None
    last_message_id: str | None


def schedule_rows() -> list[ScheduleRow]:
    now = default_clock().now()
    rows = []
    for actor in periodic_actors():
        last = (
            Job.objects.filter(actor_name=actor.actor_name)
            .order_by("-id")
            .values("enqueued_at", "state", "message_id")
            .first()
        )
        rows.append(
            ScheduleRow(
                actor=actor.actor_name,
                queue=actor.queue_name,
                cron=str(actor.options["periodic"]),
                next_run=actor.options["periodic"].next_valid_date(now),
                last_run=last["enqueued_at"] if last else None,
                last_state=last["state"] if last else None,
                last_message_id=last["message_id"] if last else None,
            )
        )
    return rows


def run_now(actor: dramatiq.Actor[Any, Any]) -> dramatiq.Message[Any] | None:
    """Enqueue ``actor`` once; a second click within a few seconds sends nothing."""
    guard = f"jobs:run-now:{actor.actor_name}"
    if not redis_broker().client.set(guard, "1", nx=True, ex=RUN_NOW_GUARD_SECONDS):
        return None
    tick = pendulum.now(default_clock().tz).replace(second=0, microsecond=0)
    # A manual run counts as the current minute's tick: if the schedule fires in
    # the same minute, the tick claim stops the second copy.
    if not claim_tick(actor.actor_name, tick):
        return None
    try:
        message: dramatiq.Message[Any] = actor.send_with_options(
            scheduled_at=str(pendulum.now(default_clock().tz)), tick=tick.isoformat(), manual=True
        )
    except Exception:
        redis_broker().client.delete(tick_key(actor.actor_name, tick), guard)  # not sent
        raise
    return message
