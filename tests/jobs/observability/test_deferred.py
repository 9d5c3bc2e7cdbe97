"""Deferred metric writes: the same figures as direct writes, a moment later, none lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dramatiq
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jobs.observability import metrics
from jobs.observability.deferred import DeferredWrites
from tests.conftest import IDLE_POLL_MS, join
from tests.jobs.ledger.test_ledger import QUEUE, succeed

ROOT = Path(__file__).resolve().parents[3]
BUCKETS = (0.005, 0.1, 1.0)
# On a bound, between bounds, past the last finite one, zero, negative
VALUES = (0.005, 0.0051, 0.1, 0.5, 1.0, 7.5, 0.0, -1.0, 0.005)


def figures(prefix: str) -> tuple[CollectorRegistry, Counter, Gauge, Histogram]:
    registry = CollectorRegistry()
    counter = Counter(f"{prefix}_jobs", "jobs", ["actor"], registry=registry)
    gauge = Gauge(f"{prefix}_running", "running", ["actor"], registry=registry)
    histogram = Histogram(
        f"{prefix}_seconds", "seconds", ["actor"], buckets=BUCKETS, registry=registry
    )
    return registry, counter, gauge, histogram


def exposition(registry: CollectorRegistry, prefix: str) -> list[str]:
    # (_created samples are the wall clock of each series' creation)
    text = generate_latest(registry).decode().replace(prefix, "x")
    return [line for line in text.splitlines() if "_created" not in line]


def test_flushed_figures_are_what_direct_writes_give() -> None:
    # Given the same writes, once direct and once deferred
    direct, counter, gauge, histogram = figures("test_deferred_direct")
    deferred_registry, d_counter, d_gauge, d_histogram = figures("test_deferred_later")
    later = DeferredWrites()
    later.FLUSH_INTERVAL = 3600  # only the flush below writes
    for actor in ("a", "b"):
        for value in VALUES:
            counter.labels(actor).inc()
            later.add(d_counter.labels(actor))
            histogram.labels(actor).observe(value)
            later.observe(d_histogram.labels(actor), value)
        gauge.labels(actor).inc(3)
        gauge.labels(actor).dec()
        later.add(d_gauge.labels(actor), 3)
        later.add(d_gauge.labels(actor), -1)
    # Nothing is written before the flush
    assert d_counter.labels("a")._value.get() == 0
    # Then the exposition is the same, bucket by bucket
    later.flush()
    assert exposition(deferred_registry, "test_deferred_later") == exposition(
        direct, "test_deferred_direct"
    )


def test_the_flusher_writes_within_its_interval() -> None:
    _, counter, _, histogram = figures("test_deferred_timer")
    later = DeferredWrites()
    later.FLUSH_INTERVAL = 0.05
    try:
        later.add(counter.labels("a"), 2)
        later.observe(histogram.labels("a"), 0.5)
        deadline = time.monotonic() + 5
        while counter.labels("a")._value.get() != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counter.labels("a")._value.get() == 2
        assert histogram.labels("a")._sum.get() == 0.5
    finally:
        later.FLUSH_INTERVAL = 3600  # its thread sleeps for the rest of the run


def test_nothing_is_lost_or_counted_twice_while_threads_add_and_the_flusher_runs() -> None:
    # Given eight threads writing while the flusher takes what came every 10 ms
    _, counter, gauge, histogram = figures("test_deferred_threads")
    later = DeferredWrites()
    later.FLUSH_INTERVAL = 0.01
    per_thread = 5_000

    def hot_path() -> None:
        for n in range(per_thread):
            later.add(counter.labels("a"))
            later.add(gauge.labels("a"))
            later.add(gauge.labels("a"), -1)
            later.observe(histogram.labels("a"), 0.05 if n % 2 else 5.0)

    threads = [threading.Thread(target=hot_path) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        later.FLUSH_INTERVAL = 3600  # its thread sleeps for the rest of the run
    later.flush()
    # Then every write is there exactly once
    jobs = 8 * per_thread
    assert counter.labels("a")._value.get() == jobs
    assert gauge.labels("a")._value.get() == 0
    buckets = [bucket.get() for bucket in histogram.labels("a")._buckets]
    assert buckets == [0, jobs / 2, 0, jobs / 2]  # 0.05 -> le=0.1, 5.0 -> +Inf
    assert histogram.labels("a")._sum.get() == pytest.approx(jobs / 2 * 5.05)


@pytest.mark.parametrize("ending", ["returns", "sys.exit"])
def test_a_worker_process_that_ends_without_stopping_its_worker_writes_what_was_pending(
    tmp_path: Path, ending: str
) -> None:
    # Given a process started as dramatiq starts its worker processes
    # (multiprocessing, which ends the child with os._exit: no atexit)
    script = textwrap.dedent(
        f"""
        import multiprocessing, sys
        from prometheus_client import Counter
        from jobs.observability import metrics  # multiprocess values, as shipped
        from jobs.observability.deferred import writes

        counter = Counter("test_deferred_child", "in a child")

        def child():
            writes.FLUSH_INTERVAL = 3600
            writes.add(counter, 2)
            if {ending == "sys.exit"!r}:
                sys.exit(3)  # as dramatiq's handler of a second SIGTERM does

        if __name__ == "__main__":
            process = multiprocessing.get_context("fork").Process(target=child)
            process.start()
            process.join()
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=ROOT, timeout=60)
    # Then its figures reached its metrics file
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    assert registry.get_sample_value("test_deferred_child_total") == 2


def test_writes_pending_at_exit_reach_the_metrics_files(tmp_path: Path) -> None:
    # Given a process in multiprocess mode that adds and exits without a flush
    script = textwrap.dedent(
        """
        from prometheus_client import Counter, values
        from jobs.observability import metrics  # multiprocess values, as shipped
        from jobs.observability.deferred import writes
        counter = Counter("test_deferred_exit", "at exit")
        writes.FLUSH_INTERVAL = 3600
        writes.add(counter, 3)
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=ROOT, timeout=60)
    # Then its metrics file has them
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    assert registry.get_sample_value("test_deferred_exit_total") == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_starts_with_nothing_pending() -> None:
    # Given writes pending in the parent when it forks
    _, counter, _, _ = figures("test_deferred_fork")
    later = DeferredWrites()
    later.FLUSH_INTERVAL = 3600
    os.register_at_fork(after_in_child=later.after_fork_in_child)
    later.add(counter.labels("a"), 5)
    pid = os.fork()
    if pid == 0:  # the child: its flush writes none of the parent's
        later.flush()
        os._exit(0 if counter.labels("a")._value.get() == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # And the parent still writes them
    later.flush()
    assert counter.labels("a")._value.get() == 5


@pytest.mark.django_db(transaction=True)
def test_a_jobs_figures_wait_for_the_flush_and_a_stopping_worker_flushes(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the middleware's writes going through a flusher that never wakes
    later = DeferredWrites()
    later.FLUSH_INTERVAL = 3600
    monkeypatch.setattr("jobs.middleware.metrics.writes", later)
    succeeded = metrics.JOBS.labels("succeed", QUEUE, "succeeded")
    before = succeeded._value.get()
    # When a job runs, its figures wait in the process, not in the metrics file
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        succeed.send(1)
        join(QUEUE)
        assert succeeded._value.get() == before
    finally:
        # And stopping the worker writes them
        worker.stop()
    assert succeeded._value.get() == before + 1
