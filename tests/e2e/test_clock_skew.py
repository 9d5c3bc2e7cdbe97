"""End to end: a worker host whose clock is wrong (issue 29's fault matrix).
A ``rundramatiq`` whose clock is an hour ahead runs the first attempts of jobs
that fail once:
their retries, due 3 s later, go to the delay queue. It stops (a deploy, a
scale-down) and a worker on a right clock takes over the delay queue. Each
retry must run about 3 s after its failure, not an hour later.

The skew is Python's wall clock (``time.time`` and ``time_ns``, which Dramatiq
and this project read) shifted by a ``sitecustomize`` module in that worker's
path; the monotonic clock is left alone. libfaketime would shift the C library's
clock too, but its 0.9.10 (Debian 12) makes Python 3.11's ``time.sleep`` fail
with EINVAL, so no worker could run under it.
Run: bin/test tests/e2e/test_clock_skew.py -s   (SQLite: the fault is the broker's)
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from django.db import connection

from jobs.broker import redis_broker
from jobs.models import Job
from tests.e2e.test_crash_safety import wait_until
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
SKEWED_SITE = """
import time

_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + {skew}
time.time_ns = lambda: _time_ns() + {skew} * 1_000_000_000
"""
JOBS = 30
SKEW_S = 3600
APP = """
import dramatiq

from jobs.broker import redis_broker


@dramatiq.actor(queue_name="skew", max_retries=3, min_backoff=3000, max_backoff=3000)
def skewed(n: int) -> None:
    client = redis_broker().client
    if client.incr(f"skew-{n}:attempts") == 1:
        raise RuntimeError("the first attempt fails")
    client.incr(f"skew-{n}:done")
"""


def test_retries_sent_by_a_host_an_hour_ahead_run_on_time_on_another(
    start_worker: Any, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    # A fault of Redis and the workers, not of the ledger's database: once per CI.
    if connection.vendor != "sqlite":
        pytest.skip(reason="a broker-side fault: runs once, in the SQLite row")
    app = tmp_path / "skew_app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(APP)
    (tmp_path / "skew_settings.py").write_text(
        "from tests.worker_settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'skew_app']  # noqa: F405\n"
    )
    worker_env["DJANGO_SETTINGS_MODULE"] = "skew_settings"
    worker_env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), *filter(None, [worker_env.get("PYTHONPATH")])]
    )
    # Given a worker an hour ahead that ran the first attempts (all failed)
    site = tmp_path / "skewed_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SKEWED_SITE.format(skew=SKEW_S))
    ahead = {"PYTHONPATH": os.pathsep.join([str(site), worker_env["PYTHONPATH"]])}
    skewed = start_worker(env=ahead, threads=2, queues=("skew",))
    skewed.wait_for_log(READY)
    client = redis_broker().client
    sent = []
    for n in range(JOBS):
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="skew", actor_name="skewed", args=(n,), kwargs={}, options={}
        )
        sent.append(redis_broker().enqueue(message))

    def attempts() -> list[int]:
        return [int(client.get(f"skew-{n}:attempts") or 0) for n in range(JOBS)]

    wait_until(lambda: all(attempts()), timeout=30)
    assert max(attempts()) == 1, "a retry ran before the hand-over: make the backoff longer"
    # When it stops, and a worker on a right clock takes its queues over
    assert skewed.terminate() == 0
    right = start_worker(threads=2, queues=("skew",))
    right.wait_for_log(READY)
    started = time.monotonic()

    # Then every retry runs within seconds, once
    def done() -> list[int]:
        return [int(client.get(f"skew-{n}:done") or 0) for n in range(JOBS)]

    with contextlib.suppress(AssertionError):  # counted below
        wait_until(lambda: all(done()), timeout=30)
    took = time.monotonic() - started
    time.sleep(1)
    lost = sum(1 for n in done() if n == 0)
    twice = sum(1 for n in attempts() if n > 2)
    ids = [m.message_id for m in sent]
    wrong = JOBS - Job.objects.filter(message_id__in=ids, state="succeeded").count()
    print(
        f"\nretries sent by a worker host {SKEW_S} s ahead, run by one on time: {JOBS} jobs; "
        f"not done {took:.1f} s after the hand-over: {lost}; run more than twice {twice}; "
        f"rows not succeeded {wrong}"
    )
    fault = f"retries sent by a worker host {SKEW_S} s ahead"
    report(FaultRow(fault, JOBS, lost, twice, wrong, took))
    namespace = redis_broker().namespace
    waiting = {
        "delayed": [
            (m.args, m.options.get("eta", 0) / 1000 - time.time())
            for m in map(dramatiq.Message.decode, client.hvals(f"{namespace}:skew.DQ.msgs"))
        ],
        "attempts": attempts(),
    }
    assert lost == 0, f"retries held for the skewed clock's hour: {waiting}"
    assert (twice, wrong) == (0, 0)
