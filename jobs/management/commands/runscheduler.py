from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django_dramatiq.management.commands.rundramatiq import Command as RunDramatiq

from jobs.broker import redis_broker
from jobs.broker.timeouts import use_worker_timeouts
from jobs.conf.migrations import pending_migrations, refusal
from jobs.scheduling.overrides import OverrideReader
from jobs.scheduling.scheduler import Scheduler, default_clock, periodic_actors


class Command(BaseCommand):
    help = (
        "Run the periodic-job scheduler (periodiq cron specs). Safe to run several at once: "
        "each (actor, tick) is claimed in Redis, so every tick is enqueued exactly once. "
        "Stops cleanly on SIGTERM or Ctrl-C."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            pending = pending_migrations()
        except DatabaseError as exc:
            # Like a worker: an outage is ridden out, not a reason to refuse.
            self.stderr.write(f"Could not check for unapplied migrations ({exc}); starting anyway")
            pending = []
        if pending:
            raise CommandError(refusal(pending))
        # Import every app's tasks modules, the way rundramatiq discovers them.
        RunDramatiq(stdout=self.stdout, stderr=self.stderr).discover_tasks_modules()
        actors = periodic_actors()
        if not actors:
            raise CommandError("No periodic actors found (dramatiq.actor(periodic=cron(...))).")
        clock = default_clock()
        self.stdout.write(f"Scheduling in {clock.tz} (speed x{clock.speed:g}):")
        overrides = OverrideReader()
        schedules = overrides.schedules(actors)  # the admin's edits, as the loop reads them
        for actor in actors:
            schedule = schedules[actor.actor_name]
            catch_up = actor.options.get("catch_up")
            extra = f", catch-up window {catch_up}" if catch_up else ""
            if schedule.overridden:
                extra += f", overridden in the admin (code: {schedule.default})"
            next_run = schedule.next_run(clock.now())
            when = f"next {next_run.isoformat()}" if next_run else "switched off"
            self.stdout.write(
                f"  {schedule.cron:<16} {actor.actor_name}@{actor.queue_name} {when}{extra}"
            )
        self.stdout.flush()
        use_worker_timeouts(redis_broker())  # a worker's Redis timeouts, not a request's
        scheduler = Scheduler(actors, clock, overrides=overrides)

        def stop(signum: int, frame: FrameType | None) -> None:
            self.stdout.write(f"Received {signal.Signals(signum).name}, stopping")
            scheduler.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        scheduler.run()
