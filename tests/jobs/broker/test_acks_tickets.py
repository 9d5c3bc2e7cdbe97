"""No ticket, held ack or held id is left behind by the skip paths
(cancelled, age limit, paused queue put back), a retried failure, or a deferral.

Run: bin/test tests/jobs/broker/test_acks_tickets.py   (also with --postgres)
"""

from __future__ import annotations

import time

import dramatiq
import pytest

from jobs.broker import queues
from jobs.errors import Deferred
from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join
from tests.jobs.broker.test_acks import held_ids_of

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "tickets"
dramatiq.get_broker().declare_queue(QUEUE)
tries: dict[str, int] = {}


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=50, max_backoff=100)
def flaky(key: str) -> None:
    tries[key] = tries.get(key, 0) + 1
    if key.startswith("fail") and tries[key] == 1:
        raise RuntimeError("once")
    if key.startswith("defer") and tries[key] == 1:
        raise Deferred("later", delay=50)


def test_skips_retries_and_deferrals_leave_nothing_held(broker, settings):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    settings.JOBS_PAUSE_RECHECK_MS = 200
    tries.clear()
    cancelled = flaky.send("cancel-me")
    queues.cancel([cancelled.message_id])
    old = flaky.send_with_options(args=("too-old",), max_age=1)
    time.sleep(0.05)
    normal = [flaky.send(f"ok-{n}") for n in range(5)]
    failing = [flaky.send(f"fail-{n}") for n in range(3)]
    deferring = [flaky.send(f"defer-{n}") for n in range(3)]
    queues.pause(QUEUE)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=3)
    worker.start()
    try:
        time.sleep(1)  # some trips through the paused queue
        queues.resume(QUEUE)
        join(QUEUE, timeout_ms=20_000)
        assert ledger.flush()
        writer = ledger._writer
        assert writer is not None
        leftovers = (
            list(writer.held),
            [set(held_ids_of(t)) for t in worker.consumers.values()],
        )
    finally:
        worker.stop()
    print(f"\nleft behind: held={leftovers[0]} ids={leftovers[1]}")
    assert leftovers == ([], [set()] * len(worker.consumers))
    states = dict(
        Job.objects.filter(
            message_id__in=[m.message_id for m in (cancelled, old, *normal, *failing, *deferring)]
        ).values_list("message_id", "state")
    )
    assert states[cancelled.message_id] == "cancelled"
    assert states[old.message_id] == "skipped"
    assert {states[m.message_id] for m in (*normal, *failing, *deferring)} == {"succeeded"}
