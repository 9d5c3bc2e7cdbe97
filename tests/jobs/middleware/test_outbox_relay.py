"""The outbox relay thread lives exactly as long as the worker that started it.

A relay left running after its worker stopped keeps publishing outbox rows
(in a test process: from a database other processes share, to the wrong Redis).

Run: bin/test tests/jobs/middleware/test_outbox_relay.py   (also with --postgres)
"""

from __future__ import annotations

import threading

import dramatiq
import pytest

from tests.conftest import IDLE_POLL_MS

pytestmark = pytest.mark.django_db(transaction=True)


def relays() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "jobs-outbox-relay" and t.is_alive())


def test_each_worker_stops_its_own_relay(broker: dramatiq.Broker) -> None:
    # Given two workers on the project broker, started one after the other
    before = relays()
    first = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    second = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    first.start()
    second.start()
    running = relays() - before
    # When both stop
    first.stop(timeout=10_000)
    second.stop(timeout=10_000)
    # Then no relay of theirs is left running
    print(f"\nrelays while both ran: {running}; after both stopped: {relays() - before}")
    assert running == 2
    assert relays() == before
