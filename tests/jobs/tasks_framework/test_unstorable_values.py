"""Django tasks whose arguments or results a database cannot store as they are.

NUL (PostgreSQL refuses it in text and jsonb), a lone surrogate (no UTF-8
column takes it) and NaN or Infinity (no database's JSON takes them, though
Python's json writes them) are stored made storable, on SQLite and PostgreSQL
alike, and never cost another task its result.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobs.ledger import writer as ledger
from jobs.models import Job
from jobs.tasks_framework.compat import TaskResult, TaskResultStatus, task
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
HOSTILE = {"nul": "a\x00b", "lone\ud800": ["\udfff", {"deep": "c\x00"}]}
STORED = {"nul": "a\ufffdb", "lone\ufffd": ["\ufffd", {"deep": "c\ufffd"}]}


@task
def returns_hostile_text() -> dict[str, Any]:
    return HOSTILE


@task
def count(*values: Any) -> int:
    return len(values)


def run_worker(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=4)
    worker.start()
    try:
        join("default")
    finally:
        worker.stop()
    assert ledger.flush()


def test_a_result_with_nul_and_lone_surrogates_is_kept_made_storable(
    broker: dramatiq.Broker,
) -> None:
    result = returns_hostile_text.enqueue()

    run_worker(broker)

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == STORED


def test_a_task_taking_unstorable_arguments_is_found_at_once_and_runs(
    broker: dramatiq.Broker,
) -> None:
    # Given a task sent with arguments no database stores as they are
    result = count.enqueue(HOSTILE, float("nan"), [float("inf"), -float("inf")])

    # Then its result is there right away, and once run it has succeeded
    assert count.get_result(result.id).status == TaskResultStatus.READY
    run_worker(broker)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    job = Job.objects.get(message_id=result.id)
    assert job.args == [STORED, "NaN", ["Infinity", "-Infinity"]]


def test_unstorable_values_cost_no_other_task_its_result_on_the_shipped_batching(
    broker: dramatiq.Broker, settings: Any
) -> None:
    # Given the shipped 200 ms batches (the suite writes at once), so the
    # hostile tasks' events share batches with the others'
    settings.JOBS_LEDGER_FLUSH_MS = 200
    results: list[TaskResult[Any, Any]] = [count.enqueue(n) for n in range(4)]
    results += [returns_hostile_text.enqueue(), count.enqueue(float("nan"), "\x00")]

    # When a worker runs them all
    run_worker(broker)

    # Then every one of them has its result
    for result in results:
        result.refresh()
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 6
