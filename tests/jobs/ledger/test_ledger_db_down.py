"""While the database is unreachable, no job that ends is acked: the writer keeps
its batch and tries again, the acks wait, and once the database is back every end
is written and then acked (a failed write used to count as written, and the acks
went out with nothing recorded).

Run: bin/test --postgres tests/jobs/ledger/test_ledger_db_down.py -s
"""

from __future__ import annotations

import shlex
import subprocess
import time

import dramatiq
import pytest
from django.db import connection
from dramatiq.brokers.redis import RedisBroker

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "db-down"
dramatiq.get_broker().declare_queue(QUEUE)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def tiny_db_down(n: int) -> None:
    pass


def pg_ctl(*args: str) -> None:
    from project.postgres_server import _as_owner, find_pg_binary

    subprocess.run(
        [*_as_owner(), find_pg_binary("pg_ctl"), *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_no_job_is_acked_while_the_database_cannot_record_its_end(
    broker: RedisBroker, settings
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only: bin/test --postgres")
    settings.JOBS_LEDGER_FLUSH_MS = 200
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        (data,) = cursor.fetchone()
    connection.close()
    msgs = f"{broker.namespace}:{QUEUE}.msgs"
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        # postgres' own command line, to start it again the same way
        with open(f"{data}/postmaster.opts") as opts:
            words = shlex.split(opts.read())
        options = shlex.join(words[3:])  # after: postgres "-D" DATA
        assert words[1:3] == ["-D", data], words
        # Given the database is down (stopped, restarting, failing over)
        pg_ctl("-D", data, "-m", "fast", "-w", "stop")
        try:
            # When jobs run
            messages = [tiny_db_down.send(n) for n in range(5)]
            time.sleep(3)
            acked_while_down = 5 - broker.client.hlen(msgs)
        finally:
            pg_ctl("-D", data, "-l", f"{data}/../postgres.log", "-o", options, "-w", "start")
        time.sleep(1)
    finally:
        worker.stop()
        ledger.flush()
    connection.close()
    recorded = Job.objects.filter(
        message_id__in=[m.message_id for m in messages], state="succeeded"
    ).count()
    print(
        f"\nwhile the database was down: {acked_while_down} of 5 jobs acked; "
        f"succeeded rows after it came back: {recorded}"
    )
    # Then none was acked before its end could be written
    assert acked_while_down == 0 or recorded == 5
