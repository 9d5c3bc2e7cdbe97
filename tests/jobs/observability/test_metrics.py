"""/metrics after real jobs through a real worker, and the toolkit's figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dramatiq
import pytest
from django.test import Client
from django_redis import get_redis_connection

from jobs.consistency.cache import cached
from jobs.consistency.locks import redis_lock
from jobs.ledger import writer as ledger
from tests.conftest import IDLE_POLL_MS, join
from tests.jobs.ledger.test_ledger import QUEUE, calls, fail_permanently, fail_times, succeed

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]


def scrape(client: Client) -> str:
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer test-token")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` with exactly ``labels``; None when absent."""
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        if dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")) == labels:
            return float(match.group(3))
    return None


def value(text: str, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` (labels in any order), 0 when absent."""
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


@pytest.fixture(autouse=True)
def _token(settings) -> None:
    settings.JOBS_METRICS_TOKEN = "test-token"


def test_metrics_count_success_retry_and_failure_with_duration_buckets(
    client: Client, broker: dramatiq.Broker
) -> None:
    calls.clear()
    before = scrape(client)

    succeed.send(1)
    fail_times.send("metrics", 1)  # fails once, then succeeds
    fail_permanently.send()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    join(QUEUE)
    worker.stop()
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("jobs_processed_total", actor="succeed", outcome="succeeded") == 1
    assert delta("jobs_processed_total", actor="fail_times", outcome="retried") == 1
    assert delta("jobs_processed_total", actor="fail_times", outcome="succeeded") == 1
    assert delta("jobs_processed_total", actor="fail_permanently", outcome="failed") == 1
    assert delta("jobs_retries_total", actor="fail_times", queue=QUEUE) == 1
    assert delta("jobs_duration_seconds_count", actor="fail_times") == 2
    assert delta("jobs_duration_seconds_bucket", actor="succeed", le="+Inf") == 1
    assert delta("jobs_enqueued_total", actor="succeed", queue=QUEUE) == 1
    assert value(after, "jobs_in_progress", actor="succeed") == 0


class _Refused(dramatiq.middleware.MiddlewareError):
    """Dramatiq logs and swallows an Exception from a before hook, but lets a
    MiddlewareError and any BaseException through: the worker then runs the
    after hooks of every middleware, those whose before hook never ran included.
    A time limit's or a cancel's asynchronous exception, landing in the thread
    while it runs the before hooks, takes the same path."""


class _RefusesFirstStart(dramatiq.Middleware):
    """A middleware listed before Metrics whose before_process_message raises once."""

    def __init__(self) -> None:
        self.refused = 0

    def before_process_message(self, broker: dramatiq.Broker, message: object) -> None:
        if not self.refused:
            self.refused += 1
            raise _Refused("refused before the job started")


def test_a_job_refused_by_an_earlier_middleware_never_counts_as_running(
    client: Client, broker: dramatiq.Broker
) -> None:
    from jobs.middleware.metrics import Metrics

    refuser = _RefusesFirstStart()
    broker.add_middleware(refuser, before=Metrics)
    try:
        succeed.send(2)
        worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
        worker.start()
        join(QUEUE)
        worker.stop()
    finally:
        broker.middleware.remove(refuser)

    assert refuser.refused == 1
    # Metrics never counted the refused start in, so it must not count it out:
    # an unmatched -1 left jobs_in_progress at -1 for the life of the process.
    assert value(scrape(client), "jobs_in_progress", actor="succeed") == 0


def test_queue_depth_is_read_from_redis(client: Client) -> None:
    for n in range(3):
        succeed.send(n)
    text = scrape(client)
    assert value(text, "jobs_queue_waiting", queue=QUEUE) == 3
    assert value(text, "jobs_queue_oldest_age_seconds", queue=QUEUE) >= 0
    assert "jobs_queue_dead" in text


def test_the_ledger_intake_backlog_is_read_from_redis(client: Client, settings) -> None:
    # Given the shipped ledger batching (first sends go through the intake) and
    # no worker to drain it
    settings.JOBS_LEDGER_FLUSH_MS = 200
    for n in range(3):
        succeed.send(n)
    assert sample(scrape(client), "jobs_ledger_intake_waiting") == 3
    # Once drained (here by a reader), nothing waits
    assert ledger.flush()
    assert sample(scrape(client), "jobs_ledger_intake_waiting") == 0


def test_cache_and_lock_metrics_move_when_the_toolkit_is_used(client: Client) -> None:
    before = scrape(client)

    cached("metrics-test", "k", lambda: 1)
    cached("metrics-test", "k", lambda: 1)
    # Another holder's lock for 1.5 s: a shorter one could expire during a pause
    # of a loaded machine before our acquire asked, and nothing would be waited.
    get_redis_connection("default").set("lock:metrics-busy", "someone", px=1500)
    with redis_lock("metrics-busy", ttl=5, wait=5):
        pass
    after = scrape(client)

    assert value(after, "jobs_cache_hits_total", namespace="metrics-test") == 1
    assert value(after, "jobs_cache_misses_total", namespace="metrics-test") == 1
    waits = value(after, "jobs_lock_wait_seconds_count") - value(
        before, "jobs_lock_wait_seconds_count"
    )
    waited = value(after, "jobs_lock_wait_seconds_sum") - value(
        before, "jobs_lock_wait_seconds_sum"
    )
    assert waits == 1
    assert waited >= 0.2  # it waited for the other holder's lock


def test_lock_acquisitions_and_held_locks_reach_the_scrape_within_a_flush_interval(
    client: Client,
) -> None:
    # The hot path only counts in memory; a thread of this process writes the
    # figures to its metrics files once a second (LockStats.FLUSH_INTERVAL).
    def settled(check: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + 5
        while True:
            text = scrape(client)
            if check(text) or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    before = scrape(client)
    count_before = value(before, "jobs_lock_wait_seconds_count")
    fast_before = value(before, "jobs_lock_wait_seconds_bucket", le="0.001")
    held_before = value(before, "jobs_locks_held")
    for n in range(50):
        with redis_lock(f"metrics-flush-{n}", ttl=5, wait=0):
            pass
    with redis_lock("metrics-flush-held", ttl=5, wait=0):
        # Settled on every figure, not the held gauge alone: the gauge sums
        # every process's file, so another process's change can meet "+1"
        # before this process's flush (seen once in CI: held 2.0, count unmoved)
        text = settled(
            lambda t: (
                value(t, "jobs_locks_held") == held_before + 1
                and value(t, "jobs_lock_wait_seconds_count") == count_before + 51
            )
        )
        assert value(text, "jobs_locks_held") == held_before + 1
        assert value(text, "jobs_lock_wait_seconds_count") == count_before + 51
        assert value(text, "jobs_lock_wait_seconds_bucket", le="0.001") == fast_before + 51
    text = settled(lambda t: value(t, "jobs_locks_held") == held_before)
    assert value(text, "jobs_locks_held") == held_before


def test_metrics_are_refused_without_the_token_outside_debug(client: Client, settings) -> None:
    settings.DEBUG = False
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    settings.JOBS_METRICS_ALLOWED_IPS = ["127.0.0.0/8"]
    assert client.get("/metrics").status_code == 200


def test_metrics_are_open_on_loopback_in_debug(client: Client, settings) -> None:
    settings.DEBUG = True
    settings.JOBS_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403


def test_a_fresh_process_serves_known_actors_and_cache_namespaces_at_zero(
    tmp_path: Path,
) -> None:
    # Given a fresh web process with its own empty metrics directory (TEST_TMP_DIR),
    # in which no job ran and no cache was read
    script = (
        "import django; django.setup();"
        "from django.test.utils import setup_test_environment; setup_test_environment();"
        "from django.test import Client;"
        "print(Client().get('/metrics', HTTP_AUTHORIZATION='Bearer fresh').content.decode())"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_TMP_DIR": str(tmp_path),
        "METRICS_TOKEN": "fresh",
    }
    # When it is scraped
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = result.stdout

    # Then every declared actor x its queue is there at zero, and the registered cache
    # namespace too, so rates and alerts on them work from the first event
    email = {"actor": "send_welcome_email", "queue": "emails"}
    for outcome in ("succeeded", "failed", "retried", "skipped"):
        assert sample(text, "jobs_processed_total", **email, outcome=outcome) == 0, outcome
    assert sample(text, "jobs_retries_total", **email) == 0
    assert sample(text, "jobs_deferred_total", **email) == 0
    assert sample(text, "jobs_enqueued_total", **email) == 0
    assert sample(text, "jobs_in_progress", **email) == 0
    assert sample(text, "jobs_duration_seconds_count", **email) == 0
    report = {"actor": "daily_report", "queue": "periodic", "outcome": "failed"}
    assert sample(text, "jobs_processed_total", **report) == 0
    assert sample(text, "jobs_cache_hits_total", namespace="user-profile") == 0
    assert sample(text, "jobs_cache_misses_total", namespace="user-profile") == 0


def _heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "jobs-heartbeat"]


@pytest.mark.django_db(transaction=True)
def test_two_workers_in_one_process_leave_no_heartbeat_beating(broker: dramatiq.Broker) -> None:
    # (Before the fix, the second worker's boot replaced the first's heartbeat,
    # whose thread beat on after both stopped, keeping a dead process "alive".)
    before = _heartbeat_threads()
    # Given two workers started in one process, then stopped
    workers = [
        dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1) for _ in range(2)
    ]
    for w in workers:
        w.start()
    during = [t for t in _heartbeat_threads() if t not in before]
    assert len(during) == 1  # one per process, as the broker id it beats for
    workers[0].stop()
    assert during[0].is_alive()  # the other worker still runs
    workers[1].stop()
    # Then no heartbeat thread of theirs is left running
    during[0].join(timeout=5)
    assert [t for t in _heartbeat_threads() if t not in before] == []


def test_a_worker_stopped_twice_leaves_the_others_heartbeat_beating(
    broker: dramatiq.Broker,
) -> None:
    # Counted, the second stop of a worker ended the heartbeat of another
    # still running: its broker id then looked dead, and maintenance handed
    # its jobs to others while they ran (and every later worker of the
    # process counted one too few).
    before = _heartbeat_threads()
    workers = [
        dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1) for _ in range(2)
    ]
    for w in workers:
        w.start()
    (beating,) = [t for t in _heartbeat_threads() if t not in before]
    workers[0].stop()
    workers[0].stop()
    dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1).stop()  # never booted
    time.sleep(0.2)
    assert beating.is_alive()
    workers[1].stop()
    beating.join(timeout=5)
    assert not beating.is_alive()
