"""A graceful stop waits for the ledger's last batch and its held acks (up to
jobs.middleware.ledger.SHUTDOWN_FLUSH_WAIT, 60 s): with the database busy for 12 s
(a long migration, a lock), the stopping worker still writes and acks the jobs
that ended, and none runs again (it used to give up after 10 s).

Run: bin/test tests/e2e/test_acks_stop.py -s   (also with --postgres)
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from jobs.broker import queues, redis_broker
from jobs.models import Job
from tests.examples.tasks import long_job
from tests.jobs.broker.test_acks import ledger_writes_blocked

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
ENV = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}
JOBS = 4


def runs(n: int) -> int:
    return int(redis_broker().client.get(f"long-job:lock-{n}:starts") or 0)


def test_a_stop_waits_for_the_ledger_to_write_and_ack_what_ended(start_worker: Any) -> None:
    # Given a worker whose operator gives a stop 30 s (--worker-shutdown-timeout)
    busy = start_worker(env=ENV, threads=2, queues=("long",), shutdown_timeout_ms=30_000)
    busy.wait_for_log(READY)
    pids = set(busy.group_pids())
    with ledger_writes_blocked():
        # and jobs that ended while the database is busy (a long migration, a lock)
        messages = [long_job.send(f"lock-{n}", 0) for n in range(JOBS)]
        deadline = time.monotonic() + 15
        while sum(runs(n) for n in range(JOBS)) < JOBS and time.monotonic() < deadline:
            time.sleep(0.05)
        # When it is asked to stop while the database stays busy for 12 s
        stopped = time.monotonic()
        busy.process.send_signal(signal.SIGTERM)
        time.sleep(12)
    busy.process.wait(timeout=40)
    exited_after = time.monotonic() - stopped

    msgs = f"{redis_broker().namespace}:long.msgs"
    client = redis_broker().client
    left = sum(bool(client.hexists(msgs, m.options["redis_message_id"])) for m in messages)
    # (a peer that would run again whatever the stop left unacked)
    peer = start_worker(env=ENV, threads=2, queues=("long",))
    peer.wait_for_log(READY)
    if left:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(runs(n) for n in range(JOBS)) < 2 * JOBS:
            queues.force_maintenance()
            time.sleep(0.5)
    ids = [m.message_id for m in messages]
    recorded_by = list(Job.objects.filter(message_id__in=ids).values_list("worker_pid", flat=True))
    print(
        f"\nworker exited {exited_after:.1f} s after SIGTERM with {left} ended job(s) "
        f"unacked; runs per job {[runs(n) for n in range(JOBS)]}; rows written by the "
        f"stopped worker: {sum(p in pids for p in recorded_by)} of {JOBS}"
    )
    # Then it waited for the ledger (within its 30 s), wrote and acked: nothing ran twice
    assert left == 0
    assert [runs(n) for n in range(JOBS)] == [1] * JOBS
