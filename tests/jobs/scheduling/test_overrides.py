"""Schedules changed in the admin: validation, the effective schedule, the scheduler follows it."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pendulum
import pytest
from django.db import OperationalError, connection
from periodiq import cron

from jobs.models import ScheduleOverride
from jobs.scheduling.overrides import (
    InvalidCron,
    OverrideReader,
    effective_schedules,
    parse_cron,
    schedule_change,
    schedule_reset,
)
from jobs.scheduling.scheduler import Clock, Scheduler
from tests.conftest import queued_messages, wait_until

QUEUE = "override-test"
Declare = Callable[..., dramatiq.Actor[[], None]]


class FixedClock:
    tz = "UTC"
    speed = 1.0

    def __init__(self, now: str) -> None:
        self._now = pendulum.parse(now)

    def now(self) -> Any:
        return self._now

    def seconds_until(self, moment: Any) -> float:
        return 0.0


class CountingReader(OverrideReader):
    """Counts the scheduler's minutes (one read of the overrides each)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> Any:
        self.reads += 1
        return super().read()


@pytest.fixture
def declare(broker: dramatiq.Broker) -> Iterator[Declare]:
    """Declare periodic actors for one test; the broker forgets them afterwards."""
    names: list[str] = []

    def declare(name: str, spec: str, **options: Any) -> dramatiq.Actor[[], None]:
        def job() -> None:
            pass

        names.append(name)
        decorate = dramatiq.actor(actor_name=name, queue_name=QUEUE, periodic=cron(spec), **options)
        actor: dramatiq.Actor[[], None] = decorate(job)
        return actor

    yield declare
    for name in names:
        del broker.actors[name]


def ticks(actor_name: str) -> Counter[str]:
    return Counter(m.options["tick"] for m in queued_messages(QUEUE) if m.actor_name == actor_name)


def start(scheduler: Scheduler) -> threading.Thread:
    def run() -> None:
        try:
            scheduler.run()
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fast_clock() -> Clock:
    # One cron minute per real second, from now.
    return Clock(tz="UTC", speed=60, epoch=time.time())


# --- validation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "read_as"),
    [
        ("0 6 * * *", "0 6 * * *"),
        ("  */15   * * *  1-5 ", "*/15 * * * 1-5"),
        ("0 6 * * 0,7", "0 6 * * 0,7"),
        ("@daily", "@daily"),
    ],
)
def test_it_accepts_what_periodiq_reads(text: str, read_as: str) -> None:
    assert str(parse_cron(text)) == read_as


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "Enter a cron expression: 5 fields"),
        ("   ", "Enter a cron expression: 5 fields"),
        ("0 6 * * * *", "must have 5 fields (minute hour day month weekday)"),
        ("0 6 * *", "must have 5 fields"),
        ("61 * * * *", "minute out of range 0-59"),
        ("*/0 * * * *", "minute step of 0"),
        ("0 6 * * someday", "weekday field periodiq cannot read"),
        ("@sometimes", "is not a name periodiq knows"),
    ],
)
def test_it_rejects_what_periodiq_cannot_run_saying_why(text: str, says: str) -> None:
    with pytest.raises(InvalidCron) as raised:
        parse_cron(text)
    assert says in str(raised.value)


# --- the effective schedule ---------------------------------------------------


@pytest.mark.django_db
def test_the_effective_schedule_is_the_codes_until_overridden(declare: Declare) -> None:
    report = declare("override_report", "0 6 * * *")

    [schedule] = effective_schedules([report]).values()
    assert (schedule.cron, schedule.enabled, schedule.overridden) == ("0 6 * * *", True, False)

    ScheduleOverride.objects.create(actor_name="override_report", cron="30 7 * * 1-5")
    [schedule] = effective_schedules([report]).values()
    assert (schedule.cron, schedule.enabled, schedule.overridden) == ("30 7 * * 1-5", True, True)
    assert schedule.default == "0 6 * * *"

    ScheduleOverride.objects.filter(actor_name="override_report").update(cron="", enabled=False)
    [schedule] = effective_schedules([report]).values()
    assert (schedule.cron, schedule.enabled, schedule.overridden) == ("0 6 * * *", False, True)
    assert schedule.next_run(pendulum.now("UTC")) is None


@pytest.mark.django_db
def test_an_override_the_admin_did_not_write_cannot_break_the_schedule(declare: Declare) -> None:
    report = declare("override_report", "0 6 * * *")
    ScheduleOverride.objects.create(actor_name="override_report", cron="0 6 * * * *")

    [schedule] = effective_schedules([report]).values()

    assert (schedule.cron, schedule.enabled) == ("0 6 * * *", True)


@pytest.mark.django_db
def test_a_change_back_to_the_codes_schedule_leaves_nothing_overridden(declare: Declare) -> None:
    report = declare("override_report", "0 6 * * *")

    before, after = schedule_change(actor=report, who="ann", cron_text="30 7 * * *")
    assert (before.cron, after.cron) == ("0 6 * * *", "30 7 * * *")
    assert ScheduleOverride.objects.get().updated_by == "ann"
    schedule_change(actor=report, who="ann", enabled=False)
    assert ScheduleOverride.objects.values_list("cron", "enabled").get() == ("30 7 * * *", False)

    schedule_change(actor=report, who="bob", cron_text="0 6 * * *")
    assert ScheduleOverride.objects.values_list("cron", "enabled").get() == ("", False)
    schedule_change(actor=report, who="bob", enabled=True)
    assert not ScheduleOverride.objects.exists()


@pytest.mark.django_db
def test_reset_deletes_the_override(declare: Declare) -> None:
    report = declare("override_report", "0 6 * * *")
    schedule_change(actor=report, who="ann", cron_text="30 7 * * *", enabled=False)

    before = schedule_reset(actor=report)

    assert (before.cron, before.enabled) == ("30 7 * * *", False)
    assert not ScheduleOverride.objects.exists()


# --- the scheduler follows it -------------------------------------------------


@pytest.mark.django_db
def test_a_disabled_schedule_is_not_enqueued_and_an_edited_one_is(declare: Declare) -> None:
    every_minute = declare("override_every_minute", "* * * * *")
    yearly = declare("override_yearly", "0 0 1 1 *")
    ScheduleOverride.objects.create(actor_name="override_every_minute", enabled=False)
    ScheduleOverride.objects.create(actor_name="override_yearly", cron="10 7 * * *")
    scheduler = Scheduler([every_minute, yearly], FixedClock("2026-11-29T07:10:00+00:00"))  # type: ignore[arg-type]

    sent = scheduler.run_due(pendulum.parse("2026-11-29T07:10:00+00:00"))  # type: ignore[arg-type]

    assert sent == 1
    assert ticks("override_every_minute") == {}
    assert ticks("override_yearly") == {"2026-11-29T07:10:00+00:00": 1}


@pytest.mark.django_db
def test_catch_up_follows_the_effective_schedule(declare: Declare) -> None:
    report = declare("override_report", "0 6 * * *", catch_up=timedelta(hours=12))
    other = declare("override_other", "0 6 * * *", catch_up=timedelta(hours=12))
    ScheduleOverride.objects.create(actor_name="override_report", cron="0 5 * * *")
    ScheduleOverride.objects.create(actor_name="override_other", enabled=False)
    clock = FixedClock("2026-11-29T07:10:00+00:00")

    assert Scheduler([report, other], clock).catch_up() == 1  # type: ignore[arg-type]

    assert ticks("override_report") == {"2026-11-29T05:00:00+00:00": 1}
    assert ticks("override_other") == {}


@pytest.mark.django_db(transaction=True)
def test_an_edited_cron_takes_effect_at_the_next_minute_without_a_restart(
    declare: Declare,
) -> None:
    # Given a running scheduler and a job the code runs once a year
    yearly = declare("override_yearly", "0 0 1 1 *")
    reader = CountingReader()
    scheduler = Scheduler([yearly], fast_clock(), reader)
    thread = start(scheduler)
    try:
        wait_until(lambda: reader.reads >= 3, timeout=60)  # it is past its first minute
        assert ticks("override_yearly") == {}

        # When an operator runs it every minute
        schedule_change(actor=yearly, who="ann", cron_text="* * * * *")

        # Then the same scheduler sends it from then on, each tick once
        wait_until(lambda: len(ticks("override_yearly")) >= 2, timeout=60)
    finally:
        scheduler.stop()
        thread.join(timeout=10)
    assert set(ticks("override_yearly").values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_a_schedule_switched_back_on_runs_again_without_a_restart(declare: Declare) -> None:
    # Given a running scheduler and an every-minute job switched off
    every_minute = declare("override_every_minute", "* * * * *")
    schedule_change(actor=every_minute, who="ann", enabled=False)
    reader = CountingReader()
    scheduler = Scheduler([every_minute], fast_clock(), reader)
    thread = start(scheduler)
    try:
        wait_until(lambda: reader.reads >= 4, timeout=60)  # three minutes or more went by
        assert ticks("override_every_minute") == {}

        # When an operator switches it back on
        schedule_reset(actor=every_minute)

        # Then the same scheduler sends it again
        wait_until(lambda: len(ticks("override_every_minute")) >= 2, timeout=60)
    finally:
        scheduler.stop()
        thread.join(timeout=10)
    assert set(ticks("override_every_minute").values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_several_schedulers_send_each_tick_of_an_override_once(declare: Declare) -> None:
    every_minute = declare("override_every_minute", "* * * * *")
    schedule_change(actor=every_minute, who="ann", cron_text="*/2 * * * *")
    clock = fast_clock()
    schedulers = [Scheduler([every_minute], clock) for _ in range(3)]
    threads = [start(s) for s in schedulers]
    try:
        wait_until(lambda: len(ticks("override_every_minute")) >= 3, timeout=60)
    finally:
        for scheduler in schedulers:
            scheduler.stop()
        for thread in threads:
            thread.join(timeout=10)

    sent = ticks("override_every_minute")
    assert set(sent.values()) == {1}, sent
    assert {pendulum.parse(tick).minute % 2 for tick in sent} == {0}, sent  # type: ignore[union-attr]


# --- the database down --------------------------------------------------------


def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    raise OperationalError("server closed the connection unexpectedly")


@pytest.mark.django_db
def test_with_the_database_down_it_keeps_the_last_overrides_read(
    declare: Declare, caplog: pytest.LogCaptureFixture
) -> None:
    every_minute = declare("override_every_minute", "* * * * *")
    ScheduleOverride.objects.create(actor_name="override_every_minute", enabled=False)
    scheduler = Scheduler([every_minute], FixedClock("2026-11-29T07:10:00+00:00"))  # type: ignore[arg-type]
    assert scheduler.run_due(pendulum.parse("2026-11-29T07:10:00+00:00")) == 0  # type: ignore[arg-type]

    caplog.set_level(logging.INFO, logger="jobs.scheduling.overrides")
    with connection.execute_wrapper(refuse):
        sent = [
            scheduler.run_due(pendulum.parse(f"2026-11-29T07:{m}:00+00:00"))  # type: ignore[arg-type]
            for m in (11, 12, 13)
        ]

    assert sent == [0, 0, 0]  # still switched off
    assert ticks("override_every_minute") == {}
    assert caplog.text.count("Could not read the schedule overrides") == 1
    scheduler.run_due(pendulum.parse("2026-11-29T07:14:00+00:00"))  # type: ignore[arg-type]
    assert "Schedule overrides readable again" in caplog.text


@pytest.mark.django_db
def test_with_the_database_down_from_the_start_it_follows_the_code(declare: Declare) -> None:
    every_minute = declare("override_every_minute", "* * * * *")
    ScheduleOverride.objects.create(actor_name="override_every_minute", enabled=False)
    scheduler = Scheduler([every_minute], FixedClock("2026-11-29T07:10:00+00:00"))  # type: ignore[arg-type]

    with connection.execute_wrapper(refuse):
        sent = scheduler.run_due(pendulum.parse("2026-11-29T07:10:00+00:00"))  # type: ignore[arg-type]

    assert sent == 1
    assert ticks("override_every_minute") == {"2026-11-29T07:10:00+00:00": 1}
