"""End to end: the SQLite ledger's disk fills up for a few seconds while a real
``rundramatiq`` drains jobs (issue 29's fault matrix). The database lives on a
tmpfs of 16 MB; a filler file takes every free byte, so SQLite's writes fail
with "database or disk is full", and is deleted 4 s later.

Counted from outside: every job's runs (Redis counters the job writes) and its
row in that database once the queue is empty. A job whose end could not be
written keeps its ack until the disk has room: none acked without its row.

Needs root (mount); skipped with the reason otherwise.
Run: bin/test tests/e2e/test_ledger_sqlite_full.py -s
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobs.broker import redis_broker
from tests.e2e.test_crash_safety import wait_until
from tests.e2e.test_ledger_pg_refusals import count_after_refusal
from tests.examples.tasks import long_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
JOBS = 150
FULL_S = 4.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        print("SKIP: mounting a small filesystem needs root")
        pytest.skip(reason="mounting a small filesystem needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no byte left (unbuffered, so
    nothing is left to fail at close)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):  # down to the last partial block
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)


def test_a_full_disk_under_the_sqlite_ledger_acks_no_job_without_its_row(
    start_worker: Any, small_disk: Path
) -> None:
    if connection.vendor != "sqlite":
        pytest.skip(reason="SQLite only: the ledger's own file on a small disk")
    # Given the test database copied onto the small disk, and a worker writing there
    database = small_disk / "ledger.sqlite3"
    with sqlite3.connect(connection.settings_dict["NAME"]) as source:
        source.execute("VACUUM INTO ?", [str(database)])
    worker = start_worker(
        env={"DATABASE_URL": f"sqlite:///{database}"}, threads=4, queues=("long",)
    )
    worker.wait_for_log(READY)
    client = redis_broker().client
    jobs = [long_job.send(f"full-{n}", 0.05) for n in range(JOBS)]
    wait_until(lambda: int(client.get("long-job:full-5:ends") or 0) >= 1, timeout=30)

    # When the disk is full for 4 s
    filler = small_disk / "filler"
    fill(filler)
    time.sleep(FULL_S)
    filler.unlink()

    # Then every job runs once and ends with its row
    def succeeded(ids: list[str]) -> int:
        with sqlite3.connect(database, timeout=30) as db:
            marks = ",".join("?" * len(ids))
            sql = "SELECT count(*) FROM jobs_job WHERE state = 'succeeded' AND message_id IN "
            return int(db.execute(f"{sql}({marks})", ids).fetchone()[0])

    fault = "SQLite disk full for 4 s under load"
    lost, twice, wrong = count_after_refusal(
        worker, jobs, "full", succeeded, fault, "the disk had room again"
    )
    assert (lost, twice, wrong) == (0, 0, 0)
