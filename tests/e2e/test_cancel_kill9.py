"""A running job is cancelled and its worker SIGKILLed (whole group) before the
cancel reached it: the message is redelivered to another worker, which skips
it. The job ends "cancelled" with who asked, and never runs a second time.

Run: bin/test tests/e2e/test_cancel_kill9.py -s   (also with --postgres)
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobs.broker import queues, redis_broker
from jobs.ledger import intake, operations
from jobs.models import Job
from tests.examples.tasks import long_job
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
# Redelivery after the kill within seconds, not the shipped minute.
ENV = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}


def counted(name: str) -> int:
    return int(redis_broker().client.get(f"long-job:kc:{name}") or 0)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_cancel_survives_the_kill_of_the_worker_running_the_job(start_worker: Any) -> None:
    victim = start_worker(env=ENV, threads=2, queues=("long",))
    victim.wait_for_log(READY)
    message = long_job.send("kc", 60)
    wait_for(lambda: counted("starts") == 1, 15, "the job to start")

    def running() -> bool:
        intake.catch_up(timeout=1)
        return Job.objects.filter(message_id=message.message_id, state="running").exists()

    wait_for(running, 15, "the ledger to show it running")
    job = Job.objects.filter(message_id=message.message_id)
    outcome = operations.cancel_jobs(job, by="e2e-operator")
    assert outcome.requested == 1
    # Killed at once: the watcher polls once a second and the job never checks,
    # so it cannot have been stopped (the forced stop comes 10 s later).
    victim.kill()
    killed = time.monotonic()

    peer = start_worker(env=ENV, threads=2, queues=("long",))
    peer.wait_for_log(READY)

    def cancelled() -> bool:
        queues.force_maintenance()
        intake.catch_up(timeout=1)
        return job.filter(state="cancelled").exists()

    wait_for(cancelled, 40, "the redelivered job to be recorded cancelled")
    took = time.monotonic() - killed
    row = job.get()
    print(
        f"\ncancel + kill -9: recorded cancelled {took:.1f} s after the kill; "
        f"runs {counted('starts')}, ends {counted('ends')}, by {row.cancelled_by!r}"
    )
    report(
        FaultRow(
            "worker SIGKILLed right after a cancel was asked",
            1,
            0,
            counted("starts") - 1,
            int(row.state != "cancelled"),
            took,
        )
    )
    assert row.cancelled_by == "e2e-operator"
    assert counted("starts") == 1  # the peer skipped it: never run a second time
    assert counted("ends") == 0
