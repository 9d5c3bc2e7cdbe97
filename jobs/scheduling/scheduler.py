"""Periodic jobs: periodiq's cron specs, scheduled exactly once per tick.

periodiq enqueues every tick once per scheduler process, so two schedulers run
each job twice. Here each (actor, tick) is claimed with ``SET NX`` in Redis
before it is sent: any number of schedulers may run (for availability) and each
tick is still enqueued once. A periodic actor may declare ``catch_up`` (a
timedelta): a tick missed while no scheduler ran is enqueued once when one comes
back, if it is no older than that window.

    @dramatiq.actor(periodic=cron("0 6 * * *"), catch_up=timedelta(hours=6))
    def daily_report() -> None: ...

The tick reaches the actor as the message option ``tick`` (ISO 8601), see
``current_tick()``, so the job can be idempotent for its tick.

The code's cron is a default: an operator may change a schedule or switch it
off in the admin (``jobs.scheduling.overrides``). The scheduler reads those
changes each minute, so it wakes every minute, and follows them for ticks and
catch-up alike.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import dramatiq
import pendulum
from dramatiq.middleware import CurrentMessage

from jobs.broker import redis_broker
from jobs.conf import jobs_settings
from jobs.scheduling.overrides import OverrideReader, Schedule

logger = logging.getLogger(__name__)
TICK_KEY_TTL = int(timedelta(days=8).total_seconds())


@dataclass(frozen=True)
class Clock:
    """Wall-clock time in the schedule's time zone, optionally sped up for tests.

    With ``speed=60`` a cron minute passes every real second, counted from
    ``epoch`` (seconds since 1970), so several processes share one fake time.
    """

    tz: str
    speed: float = 1.0
    epoch: float = 0.0

    def now(self) -> pendulum.DateTime:
        real = time.time()
        fake = self.epoch + (real - self.epoch) * self.speed if self.speed != 1 else real
        return pendulum.from_timestamp(fake, tz=self.tz)

    def seconds_until(self, moment: datetime) -> float:
        return max(0.0, (moment.timestamp() - self.now().timestamp()) / self.speed)


def default_clock() -> Clock:
    return Clock(
        tz=jobs_settings.JOBS_SCHEDULE_TZ,
        speed=jobs_settings.JOBS_SCHEDULER_SPEED,
        epoch=jobs_settings.JOBS_SCHEDULER_EPOCH,
    )


def periodic_actors(broker: dramatiq.Broker | None = None) -> list[dramatiq.Actor[Any, Any]]:
    broker = broker or redis_broker()
    actors = [a for a in broker.actors.values() if "periodic" in a.options]
    return sorted(actors, key=lambda a: a.actor_name)


def minute(moment: pendulum.DateTime) -> pendulum.DateTime:
    return moment.replace(second=0, microsecond=0)


def tick_key(actor_name: str, tick: datetime) -> str:
    return f"jobs:tick:{actor_name}:{tick.isoformat()}"


def claim_tick(actor_name: str, tick: datetime) -> bool:
    """True for exactly one caller per (actor, tick), across processes."""
    return bool(
        redis_broker().client.set(tick_key(actor_name, tick), "1", nx=True, ex=TICK_KEY_TTL)
    )


def last_tick(actor_name: str) -> str | None:
    """ISO time of the newest tick claimed for ``actor_name`` (for the admin)."""
    client = redis_broker().client
    keys = [k.decode() for k in client.scan_iter(match=f"jobs:tick:{actor_name}:*", count=1000)]
    return max((k.split(":", 3)[3] for k in keys), default=None)


def enqueue_tick(
    actor: dramatiq.Actor[Any, Any], tick: datetime, *, reason: str = "tick"
) -> dramatiq.Message[Any] | None:
    """Claim ``tick`` for ``actor`` and send it; None when another scheduler has it."""
    if not claim_tick(actor.actor_name, tick):
        logger.info("Tick %s of %s already enqueued elsewhere", tick.isoformat(), actor.actor_name)
        return None
    try:
        message = actor.send_with_options(
            scheduled_at=str(pendulum.now(jobs_settings.JOBS_SCHEDULE_TZ)), tick=tick.isoformat()
        )
    except Exception:
        # Not sent: give the claim back so the retry (ours or another
        # scheduler's) can send it, instead of finding it "already enqueued".
        with contextlib.suppress(Exception):
            redis_broker().client.delete(tick_key(actor.actor_name, tick))
        raise
    logger.info(
        "Enqueued %s (%s) for tick %s (message %s)",
        actor.actor_name,
        reason,
        tick.isoformat(),
        message.message_id,
    )
    return message


def missed_tick(
    actor: dramatiq.Actor[Any, Any], now: pendulum.DateTime, schedule: Schedule | None = None
) -> pendulum.DateTime | None:
    """The newest tick before ``now``'s minute within the actor's catch-up window.

    Of ``schedule`` (the effective one) when given, else of the code's cron.
    """
    window: timedelta | None = actor.options.get("catch_up")
    if not window or (schedule is not None and not schedule.enabled):
        return None
    spec = actor.options["periodic"] if schedule is None else schedule.spec
    candidate = spec.next_valid_date(minute(now) - window - timedelta(minutes=1))
    newest = None
    while candidate < minute(now):
        newest = candidate
        candidate = spec.next_valid_date(candidate)
    return newest


def current_tick() -> datetime | None:
    """The tick of the periodic message being processed, if any."""
    message = CurrentMessage.get_current_message()
    tick = message.options.get("tick") if message is not None else None
    return None if tick is None else pendulum.parse(tick)  # type: ignore[return-value]


class Scheduler:
    """The loop run by ``manage.py runscheduler``: sleep to the next tick, claim, send."""

    RETRY_FOR = 50.0  # seconds; less than a minute, so the next tick is not delayed

    def __init__(
        self,
        actors: list[dramatiq.Actor[Any, Any]],
        clock: Clock,
        overrides: OverrideReader | None = None,
    ) -> None:
        self.actors = actors
        self.clock = clock
        self.overrides = overrides or OverrideReader()
        self.stopping = threading.Event()

    def _enqueue(self, actor: dramatiq.Actor[Any, Any], tick: datetime, reason: str) -> bool:
        """Enqueue, retrying through a Redis outage for up to ``RETRY_FOR`` seconds."""
        deadline = time.monotonic() + self.RETRY_FOR
        while not self.stopping.is_set():
            try:
                return enqueue_tick(actor, tick, reason=reason) is not None
            except Exception:
                if time.monotonic() > deadline:
                    logger.exception("Gave up on %s tick %s", actor.actor_name, tick)
                    return False
                logger.warning(
                    "Could not enqueue %s tick %s; retrying", actor.actor_name, tick, exc_info=True
                )
                self.stopping.wait(1)
        return False

    def catch_up(self) -> int:
        now = self.clock.now()
        schedules = self.overrides.schedules(self.actors)
        sent = 0
        for actor in self.actors:
            tick = missed_tick(actor, now, schedules[actor.actor_name])
            if tick is not None and self._enqueue(actor, tick, "catch-up"):
                sent += 1
        return sent

    def run_due(self, now: pendulum.DateTime) -> int:
        tick = minute(now)
        schedules = self.overrides.schedules(self.actors)  # one query a minute
        due = [a for a in self.actors if schedules[a.actor_name].is_due(tick)]
        return sum(1 for actor in due if self._enqueue(actor, tick, "tick"))

    def next_tick(self, now: pendulum.DateTime) -> pendulum.DateTime:
        # Every minute, not the next cron match: a schedule edited in the admin
        # meanwhile takes effect at the next minute.
        return minute(now).add(minutes=1)

    def run(self) -> None:
        self.catch_up()
        # Like periodiq, run the current minute's jobs at start if they are due.
        self.run_due(self.clock.now())
        while not self.stopping.is_set():
            upcoming = self.next_tick(self.clock.now())
            if self.stopping.wait(self.clock.seconds_until(upcoming)):
                break
            self.run_due(upcoming)
        logger.info("Scheduler stopped")

    def stop(self) -> None:
        self.stopping.set()
