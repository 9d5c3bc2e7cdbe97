"""Pause and cancel reach workers through a per-process snapshot, refreshed on a timer."""

from __future__ import annotations

import time
from types import SimpleNamespace

import dramatiq
import pytest
from django.test import Client
from dramatiq.broker import MessageProxy

from jobs.broker import queues
from jobs.middleware import control as control_module
from jobs.middleware.control import Control
from tests.conftest import IDLE_POLL_MS, join
from tests.jobs.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db
QUEUE = "control-test"


def test_workers_see_a_pause_within_the_refresh_interval_not_per_job(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.JOBS_CONTROL_REFRESH_MS = 300
    # The middleware's clock, moved by hand: on the real one, a pause of a loaded
    # machine between two reads would let the snapshot refresh early.
    now = [1000.0]
    monkeypatch.setattr(control_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    control = Control()
    assert control._current().paused == frozenset()

    queues.pause("emails")
    queues.cancel(["m-1"])
    now[0] += 0.29
    assert control._current().paused == frozenset()  # still the snapshot: no round trip
    now[0] += 0.02
    snapshot = control._current()

    assert snapshot.paused == {"emails"}
    assert "m-1" in snapshot.cancelled
    queues.resume("emails")
    now[0] += 0.31
    assert control._current().paused == frozenset()


class PauseRechecks(dramatiq.Middleware):
    """Counts the deliveries a paused queue turned away (each one is a recheck)."""

    def __init__(self) -> None:
        self.count = 0

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if message.options.get("paused_requeue"):
            self.count += 1


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    pass


@pytest.mark.django_db(transaction=True)
def test_it_counts_a_paused_job_as_enqueued_once_however_often_it_is_rechecked(
    client: Client, broker: dramatiq.Broker, settings
) -> None:
    settings.JOBS_METRICS_TOKEN = "test-token"
    rechecks = PauseRechecks()
    broker.middleware.append(rechecks)
    before = scrape(client)

    queues.pause(QUEUE)
    noop.send()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while rechecks.count < 5 and time.monotonic() < deadline:
            time.sleep(0.05)  # JOBS_PAUSE_RECHECK_MS is 100 ms in the tests
        queues.resume(QUEUE)
        join(QUEUE)
    finally:
        worker.stop()
        broker.middleware.remove(rechecks)
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert rechecks.count >= 5
    assert delta("jobs_enqueued_total", actor="noop", queue=QUEUE) == 1
    assert delta("jobs_processed_total", actor="noop", outcome="succeeded") == 1
    assert delta("jobs_processed_total", actor="noop", outcome="skipped") == 0
