"""The benchmark harness runs end to end (small N) so it cannot rot; timings are not asserted
(its CPU accounting is checked against a process that burns a known amount)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import cpu

ROOT = Path(__file__).resolve().parent.parent
TEST_KNOBS = (
    "JOBS_",
    "TEST_",
    "REDIS_URL",
    "DATABASE_URL",
    "DJANGO_",
    "SIGNUP_",
    "VAR_DIR",
    "PROM",
)


SCENARIOS = (
    "throughput",
    "throughput-pg",
    "idle-latency",
    "wakeup-load",
    "enqueue",
    "admin-list",
    "signup",
    "concurrency-key",
    "slot-wakeup",
)


@pytest.mark.e2e
@pytest.mark.one_row("sqlite", "the bench starts its own Redis and databases")
@pytest.mark.timeout(300)
def test_it_runs_the_quick_benchmarks_and_prints_the_table():
    # Given the bench in quick mode, one run per variant, on scenarios that
    # together start every kind of process (workers, gunicorn, manage.py, and a
    # PostgreSQL cluster, about 10 s more; a skipped row where it is missing)
    command = [sys.executable, "-m", "bench", "--quick", "--runs", "1"]
    for name in SCENARIOS:
        command += ["--only", name]
    # When it runs (with its own Redis and database, whatever the test settings)
    # (the test settings put knobs such as JOBS_LEDGER_FLUSH_MS=0 in the environment)
    env = {k: v for k, v in os.environ.items() if not k.startswith(TEST_KNOBS)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    # Then it completes (0, or 1 when a target was missed) and prints every scenario
    assert done.returncode in (0, 1), done.stderr[-3000:]
    for name in SCENARIOS:
        assert f"\n{name} " in done.stdout, done.stdout
    # including the cheapest durable record (bench.floor), whose drain only ends
    # once its rows are in the database
    assert "minimal row 1x8 " in done.stdout, done.stdout
    # and a key's cost on jobs that do some work, beside the no-op's
    assert "alternating blocks, key, jobs of 1 ms 1x8 " in done.stdout, done.stdout


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_it_charges_a_workers_cpu_time_to_the_workers_per_job() -> None:
    # Given a process named like a worker that burns about 0.4 s of CPU, and
    # it started after the first snapshot (so it counts from zero)
    before = cpu.snapshot()
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    worker = subprocess.Popen(
        [sys.executable, "-c", burn + "input()", "dramatiq"], stdin=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            spent = cpu.per_job(before, cpu.snapshot(), jobs=1_000)
            if spent[cpu.WORKERS] >= 400:
                break
            time.sleep(0.05)
        # When its CPU is divided among 1,000 jobs
        after = cpu.snapshot()
    finally:
        worker.communicate(b"\n", timeout=10)
    # Then each job carries about 400 us of workers' CPU, nothing of other kinds'
    assert after[worker.pid][0] == cpu.WORKERS
    spent = cpu.per_job(before, after, jobs=1_000)
    assert 400 <= spent[cpu.WORKERS] < 2_000, spent
    assert cpu.medians([spent, spent])["total"] == sum(spent[kind] for kind in cpu.KINDS)


def test_its_wakeup_load_times_the_wakeup_paths_and_leaves_nothing_behind(
    redis_server: str,
) -> None:
    # Given the wakeup-load scenario's brokers (imported here: the module needs
    # Django's settings, which the test run has)
    from django.conf import settings

    from bench import procs, wakeup_load
    from jobs.broker.acks import LedgerOrderedConsumer
    from jobs.broker.wakeup import WakeupRedisBroker, _WakeupConsumer

    url = settings.BROKER_REDIS_URL
    filler = WakeupRedisBroker(url=url, instant_wakeup=False)
    on = WakeupRedisBroker(url=url, instant_wakeup=True)
    off = WakeupRedisBroker(url=url, instant_wakeup=False)
    # (each side is the consumer it is named after, not the other one twice)
    assert on.consumer_class is _WakeupConsumer
    assert off.consumer_class is LedgerOrderedConsumer
    queue = f"{on.namespace}:{procs.QUEUE}"
    for broker in (on, off):
        # When one consumer chunk is filled and timed
        wakeup_load.consumer_seconds(broker, wakeup_load.CHUNK, filler=filler)
        # Then it left no message queued, in flight or unacked: what it timed
        # was the whole path, acks included
        assert broker.client.llen(queue) == 0
        assert broker.client.hlen(f"{queue}.msgs") == 0
        assert not broker.client.keys(f"{broker.namespace}:__acks__.*")
        # and an enqueue chunk sent every message, then dropped the queue
        sent = broker.client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        wakeup_load.enqueue_seconds(broker, 50)
        after = broker.client.info("commandstats")["cmdstat_evalsha"]["calls"]
        assert after - sent >= 50  # (a first send also loads the script)
        assert not broker.client.exists(queue, f"{queue}.msgs")


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_it_times_every_console_page_and_live_refresh_on_postgresql():
    # Given the admin-pages scenario in quick mode (20,000 ledger rows in a
    # PostgreSQL database of the bench's own cluster)
    command = [sys.executable, "-m", "bench", "--quick", "--only", "admin-pages"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(TEST_KNOBS)}
    # When it runs
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=80)
    # Then it completes (0, or 1 when a target was missed: timings are not asserted)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    if "admin-pages  console pages (PostgreSQL)  skipped: " in done.stdout:  # no initdb here
        return
    # and each page and each live refresh has its row of figures (a page that
    # answered anything but 200 would have stopped the scenario before its table)
    for label in (
        "page: job list ",
        "live refresh: job list ",
        "page: search: user_id=777 ",
        "page: job page ",
        "live refresh: dashboard ",
        "live refresh: workers ",
        "page: schedules ",
    ):
        assert f"admin-pages  {label}" in done.stdout, done.stdout
    # and the argument search's plans are printed, none reading a ledger table whole
    assert "EXPLAIN ANALYZE of the ledger queries of ?q=user_id=777" in done.stdout
    assert "; seq scan: none " in done.stdout, done.stdout
