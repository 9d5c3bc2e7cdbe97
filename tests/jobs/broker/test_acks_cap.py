"""With the ledger stalled, a worker runs at most HELD_ACKS_MAX + prefetch
jobs whose acks wait, then takes no more (HELD_ACKS_MAX lowered to 5 here).

Run: bin/test tests/jobs/broker/test_acks_cap.py   (also with --postgres)
"""

from __future__ import annotations

import contextlib
import threading
import time

import dramatiq
import pytest

from jobs.broker import acks
from tests.conftest import IDLE_POLL_MS, join, wait_until
from tests.jobs.broker.test_acks import ledger_writes_blocked

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "held-cap"
dramatiq.get_broker().declare_queue(QUEUE)
ran: list[int] = []
lock = threading.Lock()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def counted(n: int) -> None:
    with lock:
        ran.append(n)


def test_a_stalled_ledger_stops_the_worker_past_the_cap(broker, settings, monkeypatch):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    monkeypatch.setattr(acks, "HELD_ACKS_MAX", 5)
    ran.clear()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)  # prefetch 4
    try:
        with ledger_writes_blocked():
            worker.start()
            [counted.send(n) for n in range(40)]
            # Up to the cap (polled: a loaded machine starts slower), then long
            # enough to see it is not passed
            with contextlib.suppress(AssertionError):
                wait_until(lambda: len(ran) >= 5, timeout=15)
            time.sleep(1.5)
            during = len(ran)
        join(QUEUE)
    finally:
        worker.stop()
    print(f"\nran while the ledger was stalled: {during}")
    assert 5 <= during <= 5 + 4
    assert sorted(ran) == list(range(40))
