"""Crash safety with real processes: workers SIGKILLed (whole process groups) under load.

What must hold: no welcome email lost or sent twice, no ledger row left wrong,
with or without ``runscheduler``; a dead worker's messages back within the
heartbeat timeout plus a few seconds; a busy worker never taken for dead.
Figures are printed (run with -s).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from jobs.broker import queues, redis_broker, workers
from jobs.ledger import states
from jobs.models import Job
from tests.e2e.conftest import STOCK_DRAMATIQ, WorkerProcess
from tests.examples.tasks import long_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."


def counter(key: str) -> int:
    return int(redis_broker().client.get(key) or 0)


def wait_until(predicate: Callable[[], bool], timeout: float, every: float = 0.1) -> float:
    """Seconds until ``predicate`` held; AssertionError after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(every)
    raise AssertionError(f"not reached in {timeout} s")


def broker_ids(worker: WorkerProcess) -> list[str]:
    """The broker ids of a worker's processes, from their presence keys."""
    client: Any = redis_broker().client
    host = workers._key().removeprefix(workers.PREFIX).rsplit(":", 1)[0]
    values = [client.get(f"{workers.PREFIX}{host}:{pid}") for pid in worker.group_pids()]
    return [i for i in (workers.read_presence(v)[0] for v in values) if i]


def unacked(broker_id: str) -> int:
    """Messages fetched by ``broker_id`` that are neither acked nor redelivered."""
    client = redis_broker().client
    keys = client.keys(f"{redis_broker().namespace}:__acks__.{broker_id}.*")
    return sum(int(client.scard(key)) for key in keys)


@pytest.mark.parametrize(
    ("busy_command", "gil"),
    [
        # Each variant in one row: the heartbeats and redelivery live in Redis.
        pytest.param(
            ("manage.py", "rundramatiq"),
            False,
            id="ours-sleeping",
            marks=pytest.mark.one_row("postgresql", "a heartbeat test, Redis-side"),
        ),
        pytest.param(
            ("manage.py", "rundramatiq"),
            True,
            id="ours-holding-the-gil",
            marks=pytest.mark.one_row("sqlite", "a heartbeat test, Redis-side"),
        ),
        # The hazard this test guards against, shown real: Dramatiq's own worker
        # keeps beating while its threads sleep (its idle delay-queue consumer
        # polls), but not while a job holds the GIL.
        pytest.param(
            STOCK_DRAMATIQ,
            True,
            id="stock-holding-the-gil",
            marks=pytest.mark.one_row("postgresql", "a heartbeat test, Redis-side"),
        ),
    ],
)
def test_it_runs_a_job_longer_than_the_heartbeat_timeout_once_on_a_busy_worker(
    start_worker: Any, busy_command: tuple[str, ...], gil: bool
) -> None:
    # A 2 s heartbeat timeout so that 6 s jobs outlast it three times over in a
    # test of seconds (the shipped timeout would make this a minute-long test).
    env = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}
    # Given a worker whose only consumer is full (1 thread: one job running, one
    # prefetched) and an idle peer that would take over its messages
    busy = start_worker(env=env, threads=1, queues=("long",), command=busy_command)
    busy.wait_for_log(READY)
    # Watched for the failure message: a false "dead" verdict needs a silence
    # past the timeout (a lapsed pulse) or a stalled Redis (judged by item 4's
    # contact period since).
    ages = HeartbeatAges()
    ages.start()
    stalls_before = redis_broker().client.info("persistence").get("aof_delayed_fsync", 0)
    long_job.send("busy-a", 6, gil)
    long_job.send("busy-b", 6, gil)
    wait_until(lambda: counter("long-job:busy-a:starts") == 1, timeout=10)
    peer = start_worker(env=env, threads=1, queues=("long",))
    peer.wait_for_log(READY)

    # When both jobs run to their end, with maintenance forced as the watchdog does
    def both_ended() -> bool:
        queues.force_maintenance()
        return counter("long-job:busy-b:ends") >= 1

    wait_until(both_ended, timeout=30, every=0.5)
    time.sleep(1)  # a second start of either would show by now

    starts = [counter(f"long-job:busy-{k}:starts") for k in "ab"]
    ages.stopping.set()
    stalls = redis_broker().client.info("persistence").get("aof_delayed_fsync", 0) - stalls_before
    seen = f"longest heartbeat silence {ages.longest_ms:.0f} ms, Redis AOF stalls {stalls}"
    print(f"\nbusy {busy_command[-1]} worker (gil={gil}): starts per job {starts}; {seen}")
    if busy_command == STOCK_DRAMATIQ:
        # Then the stock worker, silent while the job held the GIL, was taken
        # for dead and its jobs handed to the peer while they still ran
        assert max(starts) >= 2, "the stock worker's heartbeat did not lapse: no hazard shown"
    else:
        # Then each started once: our busy worker's heartbeat never lapsed
        assert starts == [1, 1], seen


@pytest.mark.one_row("postgresql", "redelivery after a kill is the broker's, in Redis")
def test_it_redelivers_a_killed_workers_job_within_the_heartbeat_timeout_without_the_scheduler(
    start_worker: Any,
) -> None:
    timeout_s = settings.JOBS_HEARTBEAT_TIMEOUT_MS / 1000  # the shipped default
    # Given a worker running a long job, an idle peer, and no scheduler
    victim = start_worker(threads=1, queues=("long",))
    victim.wait_for_log(READY)
    long_job.send("redeliver", 300)
    wait_until(lambda: counter("long-job:redeliver:starts") == 1, timeout=10)
    peer = start_worker(threads=1, queues=("long",))
    peer.wait_for_log(READY)

    # When the worker's whole process group is SIGKILLed mid-job
    victim.kill()
    elapsed = wait_until(
        lambda: counter("long-job:redeliver:starts") == 2, timeout=timeout_s + 60, every=0.2
    )

    # Then the peer has it back within the heartbeat timeout plus a few seconds
    print(f"\nredelivery without the scheduler: {elapsed:.1f} s (timeout {timeout_s:.0f} s)")
    assert elapsed < timeout_s + 5


# --- the soak --------------------------------------------------------------

SIGNUPS = 500
KILLS = 5


def signup(port: int, n: int) -> int:
    # A distinct loopback source address per five signups: the per-IP rate
    # limit (shipped default, 10/m) stays on and is never reached.
    source = f"127.0.{1 + n // 1250}.{1 + (n // 5) % 250}"
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=30, source_address=(source, 0)
    )
    body = {"username": f"soak{n}", "email": f"soak{n}@example.com", "password": "Correct-horse-9"}
    try:
        connection.request(
            "POST", "/api/signup/", json.dumps(body), {"Content-Type": "application/json"}
        )
        return connection.getresponse().status
    finally:
        connection.close()


def mailed(mail_dir: Path) -> Counter[str]:
    """Messages per recipient in the file mail backend's output."""
    return Counter(
        line[len("To: ") :]
        for path in mail_dir.glob("*.log")
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith("To: ")
    )


class HeartbeatAges(threading.Thread):
    """Samples the broker heartbeats of live workers: the longest silence seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.longest_ms = 0.0
        self.killed: set[str] = set()  # their presence keys outlive them by up to 30 s

    def run(self) -> None:
        client: Any = redis_broker().client
        while not self.stopping.wait(0.25):
            values = client.mget(client.keys(f"{workers.PREFIX}*") or [])
            live = {workers.read_presence(v)[0] for v in values if v}
            now = time.time() * 1000
            for member, score in client.zrange(workers.heartbeats_key(), 0, -1, withscores=True):
                if member.decode() in live - self.killed:
                    self.longest_ms = max(self.longest_ms, now - score)


def redelivery_time(ids: list[str], killed_at: float, results: list[float]) -> None:
    """Seconds from the kill until no message of the killed processes waits unacked."""
    while any(unacked(i) for i in ids):
        if time.monotonic() - killed_at > 300:
            return
        time.sleep(0.1)
    results.append(time.monotonic() - killed_at)


@pytest.mark.soak
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "scheduler",
    [
        # A minute each: one soak per database, the two variants split between them.
        pytest.param(
            False, id="workers-only", marks=pytest.mark.one_row("sqlite", "one soak per row")
        ),
        pytest.param(
            True, id="with-scheduler", marks=pytest.mark.one_row("postgresql", "one soak per row")
        ),
    ],
)
def test_kill_9_soak_loses_no_email_and_duplicates_only_sends_a_kill_cut(
    scheduler: bool,
    start_web: Any,
    start_worker: Any,
    start_scheduler: Any,
    worker_env: dict[str, str],
) -> None:
    rng = random.Random(12)
    timeout_s = settings.JOBS_HEARTBEAT_TIMEOUT_MS / 1000
    mail_dir = Path(worker_env["EMAIL_FILE_PATH"])
    # Given three workers (shipped settings), a web server and maybe the scheduler
    web = start_web(DJANGO_SETTINGS_MODULE="tests.e2e.soak_web_settings")
    pool = [start_worker(threads=4) for _ in range(3)]
    started = list(pool)  # every worker of the run, killed ones included (their logs)
    for worker in pool:
        worker.wait_for_log(READY)
    if scheduler:
        start_scheduler()
    ages = HeartbeatAges()
    ages.start()

    # When 500 users sign up while workers are SIGKILLed at random moments
    with ThreadPoolExecutor(4) as executor:
        signups = executor.map(lambda n: signup(web.port, n), range(SIGNUPS))
        statuses: Counter[int] = Counter()
        redeliveries: list[float] = []
        watchers = []
        for _ in range(KILLS):
            time.sleep(rng.uniform(4, 8))
            index = rng.randrange(len(pool))
            ids = broker_ids(pool[index])
            ages.killed.update(ids)
            in_flight = sum(unacked(i) for i in ids)
            pool[index].kill()
            killed_at = time.monotonic()
            if in_flight:
                watcher = threading.Thread(
                    target=redelivery_time, args=(ids, killed_at, redeliveries)
                )
                watcher.start()
                watchers.append(watcher)
            pool[index] = start_worker(threads=4)
            started.append(pool[index])
        last_kill = time.monotonic()
        statuses.update(signups)
    expected = {f"soak{n}@example.com" for n in range(SIGNUPS)}

    def settled() -> bool:
        rows = Job.objects.filter(actor_name="send_welcome_email")
        return (
            set(mailed(mail_dir)) >= expected and not rows.exclude(state=states.SUCCEEDED).exists()
        )

    # Then, within the heartbeat timeout + 30 s of the last kill, every email
    # went out once and the ledger shows every job succeeded
    with contextlib.suppress(AssertionError):  # what is missing is counted below
        wait_until(settled, timeout=timeout_s + 30 - (time.monotonic() - last_kill), every=0.5)
    time.sleep(1)  # a duplicate would arrive now
    for watcher in watchers:
        watcher.join(timeout=1)
    ages.stopping.set()
    sent = mailed(mail_dir)
    rows = list(Job.objects.filter(actor_name="send_welcome_email").values("state", "args"))
    per_user = Counter(tuple(r["args"]) for r in rows)
    lost = len(expected - set(sent))
    duplicated = sum(count - 1 for count in sent.values() if count > 1)
    # An email is an external effect: a worker killed after the SMTP send and
    # before its claim is marked done leaves no trace of the send, so the
    # redelivery sends again (at-least-once; no protocol closes that window).
    # Every duplicate must be that case: its claim taken over from a dead worker.
    taken_over = {
        match
        for worker in started
        for match in re.findall(
            r"Took over the claim on welcome-email:(\d+) from dead worker",
            worker.log_path.read_text(errors="replace"),
        )
    }
    duplicated_users = {
        str(pk)
        for pk in get_user_model()
        .objects.filter(email__in=[email for email, count in sent.items() if count > 1])
        .values_list("pk", flat=True)
    }
    unexplained = duplicated_users - taken_over
    wrong_rows = sum(1 for r in rows if r["state"] != states.SUCCEEDED)
    extra_rows = sum(count - 1 for count in per_user.values() if count > 1)
    times = sorted(redeliveries)
    print(
        f"\nsoak ({'with' if scheduler else 'without'} scheduler): {SIGNUPS} signups "
        f"{dict(statuses)}, {KILLS} kills, lost={lost}, duplicated={duplicated} "
        f"(unexplained by a kill inside the send: {len(unexplained)}), "
        f"ledger rows={len(rows)} wrong={wrong_rows} extra={extra_rows} "
        f"states={dict(Counter(r['state'] for r in rows))}; "
        f"redelivery s: {[round(t, 1) for t in times]} "
        f"p50={statistics.median(times) if times else None} max={max(times, default=None)}; "
        f"longest heartbeat silence {ages.longest_ms / 1000:.1f} s (timeout {timeout_s:.0f} s)"
    )
    assert statuses == {201: SIGNUPS}
    assert lost == 0
    assert unexplained == set(), f"duplicates without a crash inside the send: {unexplained}"
    assert duplicated <= KILLS * 4  # at most one send in flight per killed thread (4 each)
    assert (len(rows), wrong_rows, extra_rows) == (SIGNUPS, 0, 0)
