"""Periodic jobs as operators see them (the admin's schedules page, `jobs schedules`):
effective cron, next and last runs, "run now"."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import dramatiq
import pendulum

from jobs.broker import redis_broker
from jobs.models import Job
from jobs.scheduling.overrides import effective_schedules
from jobs.scheduling.scheduler import claim_tick, default_clock, periodic_actors, tick_key

RUN_NOW_GUARD_SECONDS = 10
LAST_RUNS = 5


@dataclass(frozen=True)
class Run:
    pk: int
    message_id: str
    state: str
    enqueued_at: datetime


@dataclass(frozen=True)
class ScheduleRow:
    actor: str
    queue: str
    cron: str  # the one the scheduler follows
    default: str  # the code's
    overridden: bool
    enabled: bool
    next_run: datetime | None  # None while switched off
    runs: list[Run]  # newest first

    @property
    def last_run(self) -> datetime | None:
        return self.runs[0].enqueued_at if self.runs else None


def last_runs(actor_name: str, limit: int = LAST_RUNS) -> list[Run]:
    """The newest jobs of ``actor_name`` (the ledger's index on the actor name)."""
    rows = (
        Job.objects.filter(actor_name=actor_name)
        .order_by("-id")
        .values_list("pk", "message_id", "state", "enqueued_at")[:limit]
    )
    return [Run(*row) for row in rows]


def schedule_rows() -> list[ScheduleRow]:
    now = default_clock().now()
    actors = periodic_actors()
    schedules = effective_schedules(actors)
    rows = []
    for actor in actors:
        schedule = schedules[actor.actor_name]
        rows.append(
            ScheduleRow(
                actor=actor.actor_name,
                queue=actor.queue_name,
                cron=schedule.cron,
                default=schedule.default,
                overridden=schedule.overridden,
                enabled=schedule.enabled,
                next_run=schedule.next_run(now),
                runs=last_runs(actor.actor_name),
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
