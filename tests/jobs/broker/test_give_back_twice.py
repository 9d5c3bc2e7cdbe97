"""A give-back requeue whose reply is lost is sent again: by then the worker
may have fetched the message again, and the second requeue puts the running
message back in its queue, so it runs twice (review finding, jobs/broker/acks.py).

An ack sent twice changes nothing (its payload is gone), but a requeue only
checks that the Redis id is in this worker's ack set, and it is again once this
same worker fetched the message back. The reply is lost here by a stub around
the real pipeline (as when a connection drops after Redis ran the commands);
the second run is kept in flight for a second so the retried requeue finds it.

It failed (3 runs) on review5 at a5894cf; the give-back now sets a token with
its requeue, in one script, so a second sending does nothing (acks._GIVE_BACK).

Run: bin/test tests/jobs/broker/test_give_back_twice.py
"""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
import redis

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "give-back-twice"
dramatiq.get_broker().declare_queue(QUEUE)
runs: list[float] = []


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=100, max_backoff=200)
def fails_once_then_slow() -> None:
    runs.append(time.monotonic())
    if len(runs) == 1:
        raise ValueError("the first try fails")
    time.sleep(1.5)


def test_a_give_back_whose_reply_is_lost_does_not_run_the_job_twice(broker, settings, monkeypatch):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    runs.clear()
    state = {"retry_refused": False, "reply_lost": False}
    enqueue, dispatch_all = broker.do_enqueue, broker._dispatch_all

    def retry_refused(queue_name: str, redis_id: str, data: bytes, **options: Any) -> Any:
        # The retry meets a Redis that is away: the message is to be given back
        if dramatiq.Message.decode(data).options.get("retries") and not state["retry_refused"]:
            state["retry_refused"] = True
            raise redis.ConnectionError("Connection refused")
        return enqueue(queue_name, redis_id, data, **options)

    def reply_lost(held: list[Any]) -> None:
        # The give-back's requeue reaches Redis, its reply does not come back
        dispatch_all(held)
        if any(command == "requeue" for _, _, command in held) and not state["reply_lost"]:
            state["reply_lost"] = True
            raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(broker, "do_enqueue", retry_refused)
    monkeypatch.setattr(broker, "_dispatch_all", reply_lost)
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2, queues={QUEUE})
    worker.start()
    try:
        fails_once_then_slow.send()
        deadline = time.monotonic() + 10
        while len(runs) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3)  # a third run would show by now
        assert state == {"retry_refused": True, "reply_lost": True}
        # The failed try, then one run of the message given back
        assert len(runs) == 2, f"{len(runs)} runs"
    finally:
        worker.stop()
        monkeypatch.undo()
