"""Schedules changed in the admin, over the code's ``periodic=cron(...)``.

The code's cron is each periodic actor's default. An operator may override it
(another cron expression, or switched off) with a ``ScheduleOverride`` row;
resetting deletes the row. Schedulers read every row once a minute
(``OverrideReader``), so a change takes effect at the next minute with no deploy
and no restart, and a database that is down does not stop them: they keep the
last rows read (none read yet: the code's schedules).

    schedule = effective_schedules([daily_report])["daily_report"]
    schedule.enabled, str(schedule.spec), schedule.overridden, schedule.default
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import django.db
import dramatiq
import pendulum
import redis
from django.db import close_old_connections, connection, transaction
from periodiq import CronSpec, cron

from jobs.broker import redis_broker
from jobs.conf.checks import cron_problem
from jobs.models import ScheduleOverride

logger = logging.getLogger(__name__)
_warned_invalid: set[tuple[str, str]] = set()


class InvalidCron(ValueError):
    """A cron expression periodiq cannot run; the message says why, for a person."""


MAX_CRON = ScheduleOverride._meta.get_field("cron").max_length or 100


def parse_cron(text: str) -> CronSpec:
    """``text`` as periodiq's cron spec, or ``InvalidCron`` saying what is wrong."""
    text = " ".join(text.split())
    if not text:
        raise InvalidCron(
            "Enter a cron expression: 5 fields, minute hour day month weekday (e.g. 0 6 * * *)."
        )
    if len(text) > MAX_CRON:  # the column's size
        raise InvalidCron(f"The cron expression is longer than {MAX_CRON} characters.")
    problem = cron_problem(text)  # periodiq's own parser, after checks it lacks
    if problem is not None:
        raise InvalidCron(f"The cron expression {problem}.")
    return cron(text)


@dataclass(frozen=True)
class Override:
    cron: str  # "": the code's
    enabled: bool


@dataclass(frozen=True)
class Schedule:
    """What the scheduler follows for one periodic actor."""

    actor_name: str
    spec: CronSpec
    enabled: bool
    overridden: bool
    default: str  # the code's cron text

    @property
    def cron(self) -> str:
        return str(self.spec)

    def is_due(self, tick: pendulum.DateTime) -> bool:
        return self.enabled and bool(self.spec.validate(tick))

    def next_run(self, now: pendulum.DateTime) -> pendulum.DateTime | None:
        return self.spec.next_valid_date(now) if self.enabled else None


def effective(actor: dramatiq.Actor[Any, Any], override: Override | None) -> Schedule:
    """``actor``'s schedule once ``override`` (its row, if any) is applied."""
    default: CronSpec = actor.options["periodic"]
    spec = default
    if override is not None and override.cron:
        try:
            spec = parse_cron(override.cron)
        except InvalidCron as exc:
            # Not written by the admin (which validates): keep the code's cron.
            if (actor.actor_name, override.cron) not in _warned_invalid:
                _warned_invalid.add((actor.actor_name, override.cron))
                logger.warning("Ignoring the override of %s: %s", actor.actor_name, exc)
    return Schedule(
        actor_name=actor.actor_name,
        spec=spec,
        enabled=override.enabled if override is not None else True,
        overridden=override is not None,
        default=str(default),
    )


def read_overrides() -> dict[str, Override]:
    """Every override, in one query."""
    rows = ScheduleOverride.objects.values_list("actor_name", "cron", "enabled")
    return {name: Override(cron=text, enabled=enabled) for name, text, enabled in rows}


def effective_schedules(
    actors: Iterable[dramatiq.Actor[Any, Any]], overrides: dict[str, Override] | None = None
) -> dict[str, Schedule]:
    """Each actor's schedule by name; reads the overrides unless given them."""
    overrides = read_overrides() if overrides is None else overrides
    return {a.actor_name: effective(a, overrides.get(a.actor_name)) for a in actors}


class OverrideReader:
    """The scheduler's reads: one query a call, the last rows read while the database is down."""

    def __init__(self) -> None:
        self.last: dict[str, Override] | None = None
        self.failing = False

    def read(self) -> dict[str, Override]:
        try:
            if not connection.in_atomic_block:
                # A long-running process: replace a connection the server dropped
                # or an error left unusable, as Django does between requests.
                close_old_connections()
            overrides = read_overrides()
        except django.db.Error as exc:
            if self.last is None:
                # A scheduler started while the database is down: the copy the
                # last reader kept in Redis, so that a schedule switched off
                # stays off (the code's defaults would run it).
                self.last = _kept_copy()
            if not self.failing:
                logger.warning(
                    "Could not read the schedule overrides (%s); using the last ones read", exc
                )
            self.failing = True
            return self.last or {}
        if self.failing:
            logger.info("Schedule overrides readable again")
        self.failing = False
        if overrides != self.last:
            _keep_copy(overrides)
        self.last = overrides
        return overrides

    def schedules(self, actors: Iterable[dramatiq.Actor[Any, Any]]) -> dict[str, Schedule]:
        return effective_schedules(actors, self.read())


KEPT_KEY = "jobs:schedule:overrides"


def _keep_copy(overrides: dict[str, Override]) -> None:
    document = {name: [o.cron, o.enabled] for name, o in overrides.items()}
    try:
        redis_broker().client.set(KEPT_KEY, json.dumps(document))
    except redis.RedisError as exc:  # the next change tries again
        logger.warning("Could not keep a copy of the schedule overrides in Redis: %s", exc)
        return


def _refresh_copy() -> None:
    """After an edit: the copy a scheduler started without a database reads."""
    _keep_copy(read_overrides())


def _kept_copy() -> dict[str, Override]:
    try:
        raw = redis_broker().client.get(KEPT_KEY)
        document = json.loads(raw) if raw else {}
        return {name: Override(cron=str(c), enabled=bool(e)) for name, (c, e) in document.items()}
    except (redis.RedisError, ValueError, TypeError) as exc:
        logger.warning("No copy of the schedule overrides to fall back on: %s", exc)
        return {}


def schedule_change(
    *,
    actor: dramatiq.Actor[Any, Any],
    who: str,
    cron_text: str | None = None,
    enabled: bool | None = None,
) -> tuple[Schedule, Schedule]:
    """Override ``actor``'s cron (``InvalidCron`` if wrong), switch it, or both.

    Returns the schedule before and after. A change back to the code's cron,
    switched on, deletes the row: nothing is overridden any more.
    """
    spec = None if cron_text is None else parse_cron(cron_text)
    default: CronSpec = actor.options["periodic"]
    with transaction.atomic():
        transaction.on_commit(_refresh_copy)
        row = ScheduleOverride.objects.select_for_update().filter(actor_name=actor.actor_name)
        current = row.first()
        before = effective(actor, _override(current))
        new_cron = current.cron if current is not None else ""
        if spec is not None:
            new_cron = "" if spec == default else str(spec)
        new_enabled = before.enabled if enabled is None else enabled
        if not new_cron and new_enabled:
            row.delete()
            return before, effective(actor, None)
        ScheduleOverride.objects.update_or_create(
            actor_name=actor.actor_name,
            defaults={"cron": new_cron, "enabled": new_enabled, "updated_by": who[:150]},
        )
    return before, effective(actor, Override(cron=new_cron, enabled=new_enabled))


def schedule_reset(*, actor: dramatiq.Actor[Any, Any]) -> Schedule:
    """Back to the code's schedule (the row deleted); returns the schedule before."""
    with transaction.atomic():
        transaction.on_commit(_refresh_copy)
        row = ScheduleOverride.objects.select_for_update().filter(actor_name=actor.actor_name)
        before = effective(actor, _override(row.first()))
        row.delete()
    return before


def _override(row: ScheduleOverride | None) -> Override | None:
    return None if row is None else Override(cron=row.cron, enabled=row.enabled)
