"""End to end: ``rundramatiq`` (shipped settings) across a PostgreSQL restart. The
job that ends first afterwards is recorded succeeded before its ack, and the
watchdog finds nothing to guess (it used to be acked unrecorded and then marked
failed, "left the broker without a recorded outcome").

Run: bin/test --postgres tests/e2e/test_ledger_pg_restart.py -s
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from jobs.broker import redis_broker
from jobs.models import Job
from jobs.scheduling import watchdog
from tests.e2e.test_crash_safety import wait_until
from tests.examples.tasks import long_job
from tests.fault_matrix import FaultRow, report
from tests.jobs.ledger.test_ledger_outage import restart_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."


def state(message_id: str) -> str | None:
    connection.close()  # the test's own connection may be the restarted one
    return Job.objects.filter(message_id=message_id).values_list("state", flat=True).first()


def test_a_job_ending_after_a_postgres_restart_keeps_its_success(
    start_worker: Any, settings
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only: bin/test --postgres")
    client = redis_broker().client
    worker = start_worker(threads=1, queues=("long",))
    worker.wait_for_log(READY)
    # Given a worker whose ledger writer has written a short job: it holds a connection
    warm = long_job.send("warm", 0)
    wait_until(lambda: state(warm.message_id) == "succeeded", timeout=15)
    # and a 4 s job recorded "running"
    job = long_job.send("pg-restart", 4)
    wait_until(lambda: state(job.message_id) == "running", timeout=15)

    # When PostgreSQL restarts while it runs
    restart_postgres()

    # Then once it ends and is acked ...
    wait_until(lambda: int(client.get("long-job:pg-restart:ends") or 0) == 1, timeout=15)
    msgs = f"{redis_broker().namespace}:long.msgs"
    wait_until(lambda: not client.hexists(msgs, job.options["redis_message_id"]), timeout=15)
    time.sleep(1.5)  # several flush intervals
    after_ack = state(job.message_id)
    # ... and its worker has stopped, the watchdog reconciles what the ledger says
    worker.terminate()
    settings.JOBS_WATCHDOG_GRACE_S = 0
    watchdog.reconcile_stalled_jobs()
    final = Job.objects.filter(message_id=job.message_id).values("state", "error_message").first()
    lost = "Job ledger write failed" in worker.log()
    print(
        f"\nledger after the ack: {after_ack}; after the watchdog: {final}; "
        f"worker logged a lost write: {lost}"
    )
    wrong = int(after_ack != "succeeded")
    report(FaultRow("PostgreSQL restarted while a job runs", 1, 0, None, wrong))
    assert after_ack == "succeeded", f"acked while the ledger shows {after_ack!r}"
    assert final is not None
    assert final["state"] == "succeeded"


def test_a_trickle_of_jobs_survives_a_killed_ledger_connection(start_worker: Any) -> None:
    """A worker with a job about every 200 ms (so the writer has events on each
    pass and keeps its connection, also on d4e49ab, which drops it only on idle
    passes) has its database sessions ended by the server (a failover proxy, an
    admin, a restart without downtime). A batch of one job on the dead session is
    lost (``_write_safely`` does not split a one-job batch; a bigger batch is split
    and rewritten on a new connection because atomic() closed the broken one) and
    that job is acked all the same."""
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only: bin/test --postgres")
    client = redis_broker().client
    worker = start_worker(threads=1, queues=("long",))
    worker.wait_for_log(READY)
    jobs = [long_job.send(f"trickle-{n}", 0.2) for n in range(60)]
    lost_total = 0
    for _ in range(4):  # four session kills, 2 s apart, while the trickle runs
        time.sleep(2)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
        connection.close()
    wait_until(lambda: int(client.get("long-job:trickle-59:ends") or 0) == 1, timeout=60)
    time.sleep(1.5)
    msgs = f"{redis_broker().namespace}:long.msgs"
    acked = [j for j in jobs if not client.hexists(msgs, j.options["redis_message_id"])]
    connection.close()
    done = set(
        Job.objects.filter(
            message_id__in=[j.message_id for j in acked], state="succeeded"
        ).values_list("message_id", flat=True)
    )
    lost_total = len(acked) - len(done)
    print(
        f"\ntrickle: {len(acked)} acked, {len(done)} of them recorded succeeded, "
        f"{lost_total} acked without their end; worker logged "
        f"{worker.log().count('Job ledger write failed for')} lost write(s)"
    )
    report(
        FaultRow(
            "PostgreSQL sessions killed 4 times under a trickle",
            len(jobs),
            lost_total,
            None,
            lost_total,
        )
    )
    assert lost_total == 0
