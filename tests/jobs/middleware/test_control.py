"""Pause and cancel reach workers through a per-process snapshot, refreshed on a timer."""

from __future__ import annotations

import time

import pytest

from jobs.broker import queues
from jobs.middleware.control import Control

pytestmark = pytest.mark.django_db


def test_workers_see_a_pause_within_the_refresh_interval_not_per_job(settings) -> None:
    settings.JOBS_CONTROL_REFRESH_MS = 300
    control = Control()
    assert control._current().paused == frozenset()

    queues.pause("emails")
    queues.cancel(["m-1"])
    assert control._current().paused == frozenset()  # still the snapshot: no round trip
    time.sleep(0.35)
    snapshot = control._current()

    assert snapshot.paused == {"emails"}
    assert "m-1" in snapshot.cancelled
    queues.resume("emails")
    time.sleep(0.35)
    assert control._current().paused == frozenset()
