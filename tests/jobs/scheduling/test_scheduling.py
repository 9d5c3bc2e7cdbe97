"""Periodic jobs: one enqueue per tick with several schedulers, catch-up windows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
import pytest
from django.conf import settings
from periodiq import cron

from jobs.scheduling.scheduler import Scheduler, claim_tick, missed_tick
from jobs.tasks import daily_report
from tests.conftest import queued_messages, wait_until

ROOT = Path(__file__).resolve().parents[3]


class FixedClock:
    tz = "UTC"
    speed = 1.0

    def __init__(self, now: str) -> None:
        self._now = pendulum.parse(now)

    def now(self) -> Any:
        return self._now

    def seconds_until(self, moment: Any) -> float:
        return 0.0


def ticks_in_queue(actor_name: str) -> Counter[str]:
    return Counter(
        m.options["tick"] for m in queued_messages("periodic") if m.actor_name == actor_name
    )


def test_a_tick_is_claimed_by_exactly_one_of_many_callers() -> None:
    tick = pendulum.datetime(2026, 11, 29, 6, 0)
    results: list[bool] = []
    barrier = threading.Barrier(20)

    def claim() -> None:
        barrier.wait()
        results.append(claim_tick("race", tick))

    threads = [threading.Thread(target=claim) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1


@pytest.mark.parametrize(
    ("now", "window_hours", "expected"),
    [
        ("2026-11-29T07:10:00+00:00", 12, "2026-11-29T06:00:00+00:00"),
        ("2026-11-29T05:10:00+00:00", 12, None),  # yesterday 06:00 is 23 h ago
        ("2026-11-29T19:00:00+00:00", 12, None),  # 13 h ago: outside the window
        ("2026-11-29T06:00:30+00:00", 12, None),  # the current minute is not "missed"
    ],
)
def test_missed_tick_honours_the_window(now: str, window_hours: int, expected: str | None) -> None:
    actor = type(
        "A",
        (),
        {"options": {"periodic": cron("0 6 * * *"), "catch_up": timedelta(hours=window_hours)}},
    )()
    tick = missed_tick(actor, pendulum.parse(now))  # type: ignore[arg-type]
    assert (tick.isoformat() if tick else None) == expected


@pytest.mark.django_db
def test_catch_up_runs_a_missed_tick_once_across_schedulers() -> None:
    clock = FixedClock("2026-11-29T07:10:00+00:00")

    first = Scheduler([daily_report], clock).catch_up()  # type: ignore[arg-type]
    second = Scheduler([daily_report], clock).catch_up()  # type: ignore[arg-type]

    assert (first, second) == (1, 0)
    assert ticks_in_queue("daily_report") == {"2026-11-29T06:00:00+00:00": 1}


@pytest.mark.django_db
def test_a_tick_outside_the_catch_up_window_is_not_run() -> None:
    clock = FixedClock("2026-11-29T19:00:00+00:00")
    assert Scheduler([daily_report], clock).catch_up() == 0  # type: ignore[arg-type]
    assert ticks_in_queue("daily_report") == {}


def start_schedulers(
    count: int, tmp_path: Path, epoch: float, database_url: str
) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        # A fake clock: one cron minute per real second, shared by every process.
        "JOBS_SCHEDULER_SPEED": "60",
        "JOBS_SCHEDULER_EPOCH": str(int(epoch)),
        # Only the every-minute watchdog ticks during the test.
        "REPORT_CRON": "0 0 1 1 *",
        "PRUNE_CRON": "0 0 1 1 *",
        "REPORT_CATCH_UP_HOURS": "0",
        "JOBS_LEDGER_ENABLED": "0",
    }
    procs = []
    for n in range(count):
        # The child keeps its own copy of the descriptor; ours is closed at once.
        with (tmp_path / f"scheduler-{n}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "manage.py", "runscheduler"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


@pytest.mark.e2e
@pytest.mark.parametrize("count", [2, 3])
def test_several_schedulers_enqueue_each_tick_exactly_once(
    count: int, tmp_path: Path, test_database_url: str
) -> None:
    epoch = int(time.time())
    schedulers = start_schedulers(count, tmp_path, epoch, test_database_url)
    try:
        # A few fake minutes ticked (polled: start-up takes longer on a loaded machine)
        wait_until(lambda: len(ticks_in_queue("watchdog")) >= 3, timeout=60, every=0.1)
        # One scheduler dies mid-way, half a fake minute from any tick (so not
        # between a tick's enqueue and its log line); the others keep the schedule.
        phase = ((time.time() - epoch) * 60 + epoch) % 60 / 60
        time.sleep((0.5 - phase) % 1.0)
        schedulers[0].send_signal(signal.SIGKILL)
        schedulers[0].wait()
        seen_before_kill = ticks_in_queue("watchdog")
        wait_until(
            lambda: len(ticks_in_queue("watchdog")) >= len(seen_before_kill) + 2,
            timeout=60,
            every=0.1,
        )
    finally:
        for proc in schedulers:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=20) for proc in schedulers]

    ticks = ticks_in_queue("watchdog")
    logs = "\n".join(p.read_text() for p in tmp_path.glob("scheduler-*.log"))
    assert len(seen_before_kill) >= 3, logs
    assert len(ticks) >= len(seen_before_kill) + 2, logs
    assert set(ticks.values()) == {1}, ticks
    assert codes[1:] == [0] * (count - 1)  # SIGTERM stops the survivors cleanly
    assert logs.count("Enqueued watchdog") == len(ticks)
