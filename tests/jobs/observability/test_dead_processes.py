"""Which processes' live gauge files a scrape deletes (jobs.observability.dead_processes).

The end-to-end case (a worker SIGKILLed mid-job, then /metrics) is in
tests/e2e/test_observability.py; these pin the decision per file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.broker import redis_broker, registry
from jobs.broker.workers import PREFIX as PRESENCE
from jobs.observability import dead_processes, metrics


@pytest.fixture(autouse=True)
def _ask_other_hosts_now(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test asks the registry at its first sweep, whatever the last test did.
    monkeypatch.setattr(dead_processes, "_other_hosts_checked", float("-inf"))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def files_of(directory: Path, identifier: str) -> list[str]:
    names = [
        f"gauge_livesum_{identifier}.db",
        f"gauge_liveall_{identifier}.db",
        f"counter_{identifier}.db",
        f"histogram_{identifier}.db",
        f"gauge_all_{identifier}.db",
    ]
    for name in names:
        (directory / name).write_bytes(b"")
    return names


def test_it_deletes_the_live_files_of_a_dead_process_on_this_host_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    here = metrics.host_identifier()
    dead = f"{here}-{dead_pid()}"
    alive = f"{here}-{os.getpid()}"
    files_of(tmp_path, dead)
    files_of(tmp_path, alive)

    assert dead_processes.sweep(str(tmp_path)) == [dead]

    left = sorted(p.name for p in tmp_path.iterdir())
    # The dead process's counters, histograms and "all" gauges stay: its
    # finished jobs were finished. Every file of the live process stays.
    assert [n for n in left if n.endswith(f"_{dead}.db")] == sorted(
        [f"counter_{dead}.db", f"histogram_{dead}.db", f"gauge_all_{dead}.db"]
    )
    assert len([n for n in left if n.endswith(f"_{alive}.db")]) == 5
    assert dead_processes.sweep(str(tmp_path)) == []


def test_on_another_host_it_deletes_only_what_the_registry_lists_as_lost(
    tmp_path: Path,
) -> None:
    # Given processes of another host sharing the directory: one lost 20 min
    # ago; one whose pid a live process of that host reuses (a restarted
    # container); one the registry never saw (a web process); one silent only
    # 2 min (paused, or cut off from Redis: it may come back); one lost 20 min
    # ago whose files changed since (a newer process, not registered yet)
    client = redis_broker().client
    now_ms = int(time.time() * 1000)
    long_ago, lately = now_ms - 1_200_000, now_ms - 120_000
    pipe = client.pipeline()
    registry.beat_for(pipe, "box_b", 7, "old-broker", long_ago)
    registry.beat_for(pipe, "box_b", 8, "lost-broker", long_ago)
    registry.beat_for(pipe, "box_b", 7, "new-broker", now_ms)
    registry.beat_for(pipe, "box_b", 10, "quiet-broker", lately)
    registry.beat_for(pipe, "box_b", 11, "replaced-broker", long_ago)
    pipe.execute()
    client.set(f"{PRESENCE}box_b:7", "new-broker")
    for pid in (7, 8, 9, 10, 11):
        for name in files_of(tmp_path, f"box-b-{pid}"):
            if pid != 11:  # written last before the last beat
                os.utime(tmp_path / name, (long_ago / 1000 - 60, long_ago / 1000 - 60))

    # When a scrape sweeps
    gone = dead_processes.sweep(str(tmp_path))

    # Then only the lost one's live files went
    assert gone == ["box-b-8"]
    left = {p.name for p in tmp_path.iterdir()}
    for pid in (7, 9, 10, 11):
        assert f"gauge_livesum_box-b-{pid}.db" in left
    assert "gauge_livesum_box-b-8.db" not in left
    assert "counter_box-b-8.db" in left


def test_a_file_it_cannot_read_as_a_process_is_left_alone(tmp_path: Path) -> None:
    here = metrics.host_identifier()
    odd = [f"gauge_livesum_{here}-99999999999.db", f"gauge_livesum_{here}-\u0663.db"]
    for name in odd:
        (tmp_path / name).write_bytes(b"")
    assert dead_processes.sweep(str(tmp_path)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(odd)


def test_a_process_drops_the_live_files_a_dead_one_of_its_pid_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarted container: same host name, same pid, the old process's files
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    files_of(tmp_path, metrics.process_identifier())
    metrics.forget_previous_process()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not [name for name in left if name.startswith("gauge_live")]
    assert len(left) == 3  # counters, histograms, "all" gauges stay


def test_with_redis_away_it_sweeps_this_host_and_the_scrape_goes_on(tmp_path: Path) -> None:
    import redis

    here = metrics.host_identifier()
    dead = f"{here}-{dead_pid()}"
    files_of(tmp_path, dead)
    files_of(tmp_path, "box-b-8")
    broker = redis_broker()
    # A port nothing listens on: refused at once.
    options = {**broker.client.connection_pool.connection_kwargs, "port": 1}
    options.pop("path", None)
    real_client, broker.client = (
        broker.client,
        redis.Redis(connection_pool=redis.ConnectionPool(**{**options, "host": "127.0.0.1"})),
    )
    try:
        started = time.monotonic()
        gone = dead_processes.sweep(str(tmp_path))
        elapsed = time.monotonic() - started
    finally:
        broker.client = real_client
    assert gone == [dead]
    assert elapsed < 1.0
    assert (tmp_path / "gauge_livesum_box-b-8.db").exists()
