"""Fault injection against real processes: kill -9 workers, stop Redis, restart Redis.

Figures are printed (run with -s) for the closing notes: jobs lost, duplicates,
interrupted attempts.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from jobs.broker import queues
from jobs.ledger import writer as ledger
from jobs.models import EffectRecord, Job, JobAttempt
from jobs.scheduling.watchdog import reconcile_stalled_jobs
from project.redis_server import RedisServer
from tests.e2e.conftest import free_port
from tests.examples.tasks import demo_pipeline
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
FAST_RECOVERY = {
    # A dead worker's messages are redelivered after 1 s of silence (on the next
    # broker maintenance, which the test forces the way the watchdog does).
    "JOBS_HEARTBEAT_TIMEOUT_MS": "1000",
    "JOBS_LEDGER_FLUSH_MS": "50",
    "JOBS_OUTBOX_RELAY_INTERVAL_MS": "300",
    "JOBS_OUTBOX_GRACE_MS": "300",
    "SIGNUP_RATE_LIMIT": "off",
}


def wait_until(predicate: Any, timeout: float, every: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if every:
            every()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("not reached in time")


def effects(prefix: str) -> int:
    return EffectRecord.objects.filter(key__startswith=prefix).count()


def test_killing_workers_mid_job_loses_nothing_and_duplicates_nothing(
    start_worker: Any, settings: Any
) -> None:
    rng = random.Random(7)
    messages = [demo_pipeline.send(f"kill-{n}", steps=3, step_ms=25) for n in range(200)]
    kills = 0
    worker = start_worker(env=FAST_RECOVERY, processes=1, threads=4)
    deadline = time.monotonic() + 150
    while effects("demo-pipeline:kill-") < 200 and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.8, 2.0))
        if effects("demo-pipeline:kill-") < 200 and kills < 5:
            worker.kill()  # SIGKILL to the whole process group, mid-job
            kills += 1
            worker = start_worker(env=FAST_RECOVERY, processes=1, threads=4)
        queues.force_maintenance()  # what the watchdog does every minute

    wait_until(
        lambda: effects("demo-pipeline:kill-") == 200, timeout=30, every=queues.force_maintenance
    )
    assert worker.terminate() == 0
    ledger.flush()
    # What the watchdog does each minute: ghosts of killed workers are reconciled
    # with the broker (a success whose ledger batch died with its worker).
    settings.JOBS_WATCHDOG_GRACE_S = 0
    reconciled = len(reconcile_stalled_jobs())
    lost = 200 - effects("demo-pipeline:kill-")
    duplicates = EffectRecord.objects.filter(key__startswith="demo-pipeline:kill-").count() - 200
    ids = [m.message_id for m in messages]
    interrupted = JobAttempt.objects.filter(job_id__in=ids, error_type="WorkerLost").count()
    states = set(Job.objects.filter(message_id__in=ids).values_list("state", flat=True))
    print(
        f"\nkill -9: 200 jobs, {kills} kills, lost={lost}, duplicates={duplicates}, "
        f"interrupted attempts recorded={interrupted}, reconciled by the watchdog={reconciled}"
    )
    wrong = Job.objects.filter(message_id__in=ids).exclude(state="succeeded").count()
    report(
        FaultRow(
            f"worker process group SIGKILLed mid-job, {kills} times", 200, lost, duplicates, wrong
        )
    )
    assert kills >= 3
    assert (lost, duplicates) == (0, 0)
    assert states == {"succeeded"}


def signup(base: str, n: int) -> int:
    body = {
        "username": f"outage{n}",
        "email": f"outage{n}@example.com",
        "password": "correct-horse-battery",
    }
    request = urllib.request.Request(
        f"{base}/api/signup/",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=15) as response:
        return int(response.status)


@pytest.mark.one_row("postgresql", "a broker-side fault (Redis stopped)")
def test_signups_during_a_redis_outage_are_all_mailed_once_it_is_back(
    start_web: Any, start_worker: Any, worker_env: dict[str, str], tmp_path: Path
) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    env = {**FAST_RECOVERY, "REDIS_URL": redis.url}
    try:
        web = start_web(**env)
        worker = start_worker(env=env)
        worker.wait_for_log("Worker process is ready for action.")

        redis.stop()
        statuses = [signup(web.url, n) for n in range(20)]
        redis.start()

        mail_dir = Path(worker_env["EMAIL_FILE_PATH"])

        def recipients() -> list[str]:
            # Messages, not files: the file backend names a file by the second and
            # the backend object's id, so two mails may share one file.
            return [
                line
                for f in mail_dir.glob("*.log")
                for line in f.read_text().splitlines()
                if line.startswith("To: ")
            ]

        wait_until(lambda: len(recipients()) >= 20, timeout=90)
        time.sleep(1)  # a duplicate would arrive now
        wait_until(
            lambda: all("-" * 79 in f.read_text() for f in mail_dir.glob("*.log")), timeout=10
        )
        sent = recipients()
        print(
            f"\nRedis outage: {len(statuses)} signups, statuses={set(statuses)}, "
            f"emails={len(sent)}, distinct={len(set(sent))}"
        )
        report(
            FaultRow(
                "Redis down while signups come in (outbox)",
                statuses.count(201),
                20 - len(set(sent)),
                len(sent) - len(set(sent)),
                None,
            )
        )
        assert statuses == [201] * 20
        assert len(sent) == len(set(sent)) == 20
        worker.terminate()
    finally:
        redis.stop()


@pytest.mark.one_row("postgresql", "a broker-side fault (Redis restarted)")
def test_waiting_jobs_survive_a_redis_restart_with_aof(start_worker: Any, tmp_path: Path) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        producer = RedisBroker(url=redis.url)  # type: ignore[no-untyped-call]
        for n in range(1000):
            producer.enqueue(
                dramatiq.Message(
                    queue_name="default",
                    actor_name="demo_pipeline",
                    args=(f"aof-{n}",),
                    kwargs={"steps": 1},
                    options={},
                )
            )
        redis.stop()  # SIGTERM: Redis flushes its append-only file
        redis.start()
        assert producer.client.llen("dramatiq:default") == 1000

        worker = start_worker(env={**FAST_RECOVERY, "REDIS_URL": redis.url}, threads=8)
        wait_until(lambda: effects("demo-pipeline:aof-") == 1000, timeout=120)
        print(
            f"\nAOF restart: 1000 waiting jobs, {effects('demo-pipeline:aof-')} ran after restart"
        )
        ran = effects("demo-pipeline:aof-")
        report(
            FaultRow("Redis restarted with 1,000 jobs waiting (AOF)", 1000, 1000 - ran, None, None)
        )
        assert worker.terminate() == 0
    finally:
        redis.stop()
