"""The benchmark harness runs end to end (small N) so it cannot rot; timings are not asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


SCENARIOS = ("throughput", "throughput-pg", "idle-latency", "enqueue", "admin-list", "signup")


@pytest.mark.e2e
@pytest.mark.timeout(180)
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
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=160)
    # Then it completes (0, or 1 when a target was missed) and prints every scenario
    assert done.returncode in (0, 1), done.stderr[-3000:]
    for name in SCENARIOS:
        assert f"\n{name} " in done.stdout, done.stdout
