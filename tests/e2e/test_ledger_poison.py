"""End to end: a poison event among good ones (issue 29's fault matrix). One
message is sent with ``max_retries=-2``: its ledger row breaks the table's CHECK
constraint (attempts below zero), in the same batches as 40 good jobs a real
``rundramatiq`` runs. Every job runs once, every good row is right, and the
poison job still has a row with its state and what the database refused.

Run: bin/test tests/e2e/test_ledger_poison.py -s   (also with --postgres)
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from jobs.broker import redis_broker
from jobs.ledger import writer
from jobs.models import Job
from tests.e2e.test_crash_safety import wait_until
from tests.examples.tasks import long_job
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
GOOD = 40


def test_a_poison_event_among_good_ones_costs_no_job_its_row(start_worker: Any) -> None:
    worker = start_worker(threads=4, queues=("long",))
    worker.wait_for_log(READY)
    client = redis_broker().client
    # Given 40 good jobs and, among them, one whose row the database refuses
    good = [long_job.send(f"good-{n}", 0.02) for n in range(GOOD // 2)]
    poison = long_job.send_with_options(args=("poison", 0.02), max_retries=-2)
    good += [long_job.send(f"good-{n}", 0.02) for n in range(GOOD // 2, GOOD)]

    # When the worker has run them all
    started = time.monotonic()
    wait_until(lambda: client.hlen(f"{redis_broker().namespace}:long.msgs") == 0, timeout=60)
    took = time.monotonic() - started

    def rows() -> dict[str, tuple[str, str]]:
        connection.close()
        ids = [m.message_id for m in [*good, poison]]
        found = Job.objects.filter(message_id__in=ids).values_list(
            "message_id", "state", "error_type"
        )
        return {mid: (state, error_type) for mid, state, error_type in found}

    wait_until(lambda: len(rows()) == GOOD + 1, timeout=15)
    found = rows()
    runs = [int(client.get(f"long-job:good-{n}:ends") or 0) for n in range(GOOD)]
    runs.append(int(client.get("long-job:poison:ends") or 0))
    lost = sum(1 for count in runs if count == 0)
    twice = sum(1 for count in runs if count > 1)
    wrong = sum(1 for m in good if found.get(m.message_id, ("", ""))[0] != "succeeded")
    poison_row = found.get(poison.message_id)
    print(
        f"\npoison event among {GOOD} good jobs: lost {lost}, run twice {twice}, good rows "
        f"wrong {wrong}; the poison job's row: {poison_row}"
    )
    report(
        FaultRow(
            "a poison event among good ones",
            GOOD + 1,
            lost,
            twice,
            wrong + int(poison_row is None),
            took,
            "its own row: state kept, values refused",
        )
    )
    assert (lost, twice, wrong) == (0, 0, 0)
    assert poison_row == ("succeeded", writer.VALUES_REFUSED)
