"""Redis locks against a real Redis, real processes and a real in-process worker."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from django.contrib.auth.models import User
from django_redis import get_redis_connection

from jobs.checks import check_lock_ttls
from jobs.consistency.locks import LockLost, LockNotAcquired, holds_lock, redis_lock, stats
from jobs.errors import TransientJobError
from tests.conftest import AttemptRecorder, join, wait_until

ROOT = Path(__file__).resolve().parents[3]


def run_helper(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.consistency.lock_helper", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def count_with_processes(env: dict[str, str], *, locked: bool) -> int:
    user = User.objects.create_user(f"counter-{locked}", last_name="0")
    processes = [
        run_helper(env, "increment", str(user.pk), "200", "1" if locked else "0") for _ in range(8)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=90)
        assert process.returncode == 0, stderr
    user.refresh_from_db()
    return int(user.last_name)


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_row("postgresql", "the lock is Redis's; 20 s of processes, once")
def test_it_serialises_8_processes_x_200_increments_and_loses_updates_without_it(
    subprocess_env: dict[str, str],
) -> None:
    # Given 8 processes doing read-modify-write on one row, 200 times each
    # When they do it without the lock, then under the lock
    unlocked = count_with_processes(subprocess_env, locked=False)
    locked = count_with_processes(subprocess_env, locked=True)

    # Then without it updates are lost; with it every increment counts
    assert unlocked < 1600
    assert locked == 1600


@pytest.mark.django_db(transaction=True)
def test_a_killed_holders_lock_expires_after_one_ttl(subprocess_env: dict[str, str]) -> None:
    # Given a process holding a renewed lock with a 1 s TTL (renewed every 333
    # ms: a stall shorter than 667 ms on a loaded machine does not lose it)
    holder = run_helper(subprocess_env, "hold", "report:killed", "1")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        # Renewal keeps it: a wait longer than the TTL does not get it
        with pytest.raises(LockNotAcquired), redis_lock("report:killed", ttl=1, wait=1.5):
            pass
    finally:
        holder.kill()  # SIGKILL: no release, no more renewals
        holder.wait()
    killed_at = time.monotonic()

    # When another process asks for it, it gets it within about one TTL
    with redis_lock("report:killed", ttl=1, wait=10) as lock:
        proceeded_after = time.monotonic() - killed_at
    # (not the default 30 s TTL nor never; the margin absorbs a loaded machine)
    assert proceeded_after <= 1 + 0.75
    assert lock.waited > 0


def test_a_stale_holder_is_rejected_by_the_fencing_check() -> None:
    # Given holder A that took its fencing token, then paused past its TTL, and
    # holder B who took the lock since
    client = get_redis_connection("default")
    with pytest.raises(LockLost), redis_lock("report:fenced", ttl=0.3, renew=False) as first:  # noqa: PT012
        first_token = first.fencing_token
        time.sleep(0.4)
        with redis_lock("report:fenced", ttl=5, wait=0) as second:
            assert second.fencing_token > first_token
            # When both write with their fencing tokens
            assert second.fenced_set("report:fenced:body", "from B")
            assert not first.fenced_set("report:fenced:body", "from A")
        with pytest.raises(LockLost):
            first.check()

    # Then only the current holder's write stands
    assert client.get("report:fenced:body") == b"from B"


def test_it_lets_the_fence_counter_expire_and_a_new_counter_still_fences_old_holders() -> None:
    client = get_redis_connection("default")
    # Given a holder that wrote with its fencing token
    with redis_lock("report:daily", ttl=5) as first:
        assert first.fenced_set("report:daily:body", "first")

    # Then the counter does not stay forever, and outlives any lock by far
    assert client.pttl("lock:report:daily:fence") > 24 * 3600 * 1000

    # When it expired (a week with nobody taking the lock) and a new holder comes
    client.delete("lock:report:daily:fence")
    with redis_lock("report:daily", ttl=5) as second:
        # Then the new holder's token is still above the old one, so it can write
        assert second.fencing_token > first.fencing_token
        assert second.fenced_set("report:daily:body", "second")
        assert not first.fenced_set("report:daily:body", "stale")
    assert client.get("report:daily:body") == b"second"


def test_a_lock_that_never_fences_issues_no_token_and_an_acquire_is_one_set() -> None:
    client = get_redis_connection("default")
    client.config_resetstat()
    # When a holder takes and leaves a lock without asking for its fencing token
    with redis_lock("unfenced", ttl=5, renew=False) as lock:
        value = client.get(lock.key)
    # Then the acquire was one SET (no script), and no fence counter was touched
    calls = {k: v["calls"] for k, v in client.info("commandstats").items()}
    assert calls.get("cmdstat_set") == 1
    assert "cmdstat_incr" not in calls
    assert client.exists("lock:unfenced:fence") == 0
    # And the key told the watchdog when it was taken (ms, the holder's wall clock)
    token, _, since = value.decode().rpartition("@")
    assert token == lock.token.rpartition("@")[0]
    assert abs(int(since) - time.time() * 1000) < 5_000


def test_a_holder_asking_for_its_fence_after_losing_the_lock_is_told_it_lost_it() -> None:
    client = get_redis_connection("default")
    lost_before = stats.snapshot()["lost"]
    # Given holder A whose lock expired before it asked for a fencing token, and B
    # who took the lock since and wrote with its token
    with pytest.raises(LockLost), redis_lock("late-fence", ttl=0.3, renew=False) as first:  # noqa: PT012
        time.sleep(0.4)
        with redis_lock("late-fence", ttl=5, wait=0) as second:
            assert second.fenced_set("late-fence:body", "from B")
            # When A asks for its token now
            # Then it gets none (the token script found B's value), so it writes nothing
            with pytest.raises(LockLost):
                first.fencing_token  # noqa: B018
            with pytest.raises(LockLost):
                first.fenced_set("late-fence:body", "from A")
            # And A is marked lost by the script, not only by its clock
            assert first._lost
    assert client.get("late-fence:body") == b"from B"
    assert stats.snapshot()["lost"] == lost_before + 1


def test_renewal_keeps_a_lock_for_three_times_its_ttl_and_without_it_the_lock_is_lost() -> None:
    def others_got_it(name: str, until: float) -> bool:
        while time.monotonic() < until:
            try:
                with redis_lock(name, ttl=1, wait=0.05):
                    return True
            except LockNotAcquired:
                pass
        return False

    # Given a block running 3x a 1 s TTL, with renewal (every 333 ms: a stall
    # shorter than 667 ms on a loaded machine does not lose it)
    with redis_lock("renewed", ttl=1) as lock:
        stolen = others_got_it("renewed", time.monotonic() + 3)
        lock.check()
    # Then nobody else got it and leaving the block is fine
    assert not stolen

    # And without renewal the same block loses it, and is told so
    with pytest.raises(LockLost), redis_lock("unrenewed", ttl=0.3, renew=False):
        assert others_got_it("unrenewed", time.monotonic() + 0.9)


def test_a_lock_lost_while_held_raises_from_check_and_from_the_block() -> None:
    lost_before = stats.snapshot()["lost"]
    with pytest.raises(LockLost), redis_lock("vanishing", ttl=0.3) as lock:  # noqa: PT012
        # When the key vanishes under us (expired during a pause, flushed, taken)
        get_redis_connection("default").delete(lock.key)
        deadline = time.monotonic() + 1
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        # Then the watchdog noticed and the holder learns it
        with pytest.raises(LockLost):
            lock.check()
    assert stats.snapshot()["lost"] == lost_before + 1


def test_it_releases_only_its_own_lock() -> None:
    client = get_redis_connection("default")
    with pytest.raises(LockLost), redis_lock("shared", ttl=0.2, renew=False) as lock:  # noqa: PT012
        time.sleep(0.3)
        client.set(lock.key, "someone-else", px=5000)
    # The stale holder's release did not delete the new holder's key
    assert client.get(lock.key) == b"someone-else"


def test_an_acquire_timeout_raises_a_transient_error_and_records_the_wait() -> None:
    timeouts_before = stats.snapshot()["timeouts"]
    with redis_lock("busy", ttl=5):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as raised, redis_lock("busy", wait=0.2):
            pass
        assert 0.2 <= time.monotonic() - started < 0.5
    assert isinstance(raised.value, TransientJobError)
    assert stats.snapshot()["timeouts"] == timeouts_before + 1


locked_runs: list[str] = []


@dramatiq.actor(queue_name="lock-tests", max_retries=5)
def locked_job(name: str) -> None:
    with redis_lock(name, ttl=5, wait=0.3):
        locked_runs.append(name)


@dramatiq.actor(queue_name="lock-tests", max_retries=0)
def patient_job(name: str) -> None:
    with redis_lock(name, ttl=5, wait=30):
        locked_runs.append(name)


@pytest.mark.django_db(transaction=True)
def test_an_actor_that_cannot_get_the_lock_is_retried(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    locked_runs.clear()
    # Given the lock held elsewhere until the actor's 0.3 s wait has run out
    # (held until that attempt ended: a fixed sleep races the worker's pickup)
    with redis_lock("job-lock", ttl=5):
        locked_job.send("job-lock")
        wait_until(lambda: bool(attempts.attempts))
    join("lock-tests")

    # Then the first attempt failed with LockNotAcquired and a retry ran it
    assert isinstance(attempts.attempts[0][2], LockNotAcquired)
    assert attempts.attempts[-1][2] is None
    assert locked_runs == ["job-lock"]


@pytest.mark.django_db(transaction=True)
def test_a_long_wait_is_logged_with_the_lock_name_and_message_id(
    worker: dramatiq.Worker,
    attempts: AttemptRecorder,
    caplog: pytest.LogCaptureFixture,
    settings,
) -> None:
    settings.JOBS_LOCK_WAIT_WARNING_MS = 50
    caplog.set_level(logging.WARNING, logger="jobs.consistency.locks")
    # Given the lock held 0.2 s past the actor's start, within its wait
    with redis_lock("slow-lock", ttl=5):
        message = patient_job.send("slow-lock")
        wait_until(lambda: attempts.is_running(message.message_id))
        time.sleep(0.2)
    join("lock-tests")

    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waited")]
    assert len(waits) == 1
    assert "slow-lock" in waits[0]
    assert message.message_id in waits[0]


def test_the_system_check_warns_when_a_time_limit_outlives_an_unrenewed_lock() -> None:
    @dramatiq.actor(queue_name="lock-tests", time_limit=120_000)
    @holds_lock("nightly:{0}", ttl=60, renew=False)
    def outlives_its_lock(day: str) -> None:
        pass

    @dramatiq.actor(queue_name="lock-tests", time_limit=120_000)
    @holds_lock("renewed:{0}", ttl=60)
    def renews_its_lock(day: str) -> None:
        pass

    warnings = [w for w in check_lock_ttls() if w.id == "jobs.W001"]

    assert [w.obj for w in warnings] == ["outlives_its_lock"]
    assert "nightly:{0}" in warnings[0].msg


def test_holds_lock_runs_the_function_under_the_named_lock() -> None:
    @holds_lock("report:{0}", ttl=5, wait=0)
    def report(day: str) -> str:
        with pytest.raises(LockNotAcquired), redis_lock(f"report:{day}", wait=0):
            pass
        return day

    assert report("2026-11-29") == "2026-11-29"
