"""A job that fails because Redis is gone, while a failover is under way.

Dramatiq's Retries middleware re-enqueues a failed message and the message is
then acked. With Redis unreachable the re-enqueue raises, Dramatiq logs the
error of the hook and goes on, and the ack (held for the ledger, retried until
Redis answers) lands on the promoted replica: the job is gone, its ledger row
left "running". Staged with real servers: the replica is stopped so no
promotion can happen while the job fails, then let go.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from jobs.models import Job
from tests.e2e.test_crash_safety import READY, wait_until
from tests.ha.cluster import SentinelCluster

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def enqueue(
    cluster: SentinelCluster, key: str, gate: Path, actor: str = "gated_redis_job"
) -> dramatiq.Message[Any]:
    producer = RedisBroker(client=cluster.client(cluster.primary.port))  # type: ignore[no-untyped-call]
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="long",
        actor_name=actor,
        args=(key, str(gate)),
        kwargs={},
        options={},
    )
    return producer.enqueue(message)


def ran_again(replica: Any, key: str, message: dramatiq.Message[Any], worker: Any) -> Job:
    """Wait for the gated job ``key`` to run on the promoted replica, print what
    the new primary holds, assert it ran once; its ledger row."""

    def ran() -> bool:
        return replica.get(f"gated-job:{key}:runs") is not None

    def ended() -> bool:
        state = Job.objects.filter(message_id=message.message_id).values_list("state", flat=True)
        return ran() and list(state) not in ([], ["running"], ["enqueued"])

    # The run is counted in Redis a moment before its end reaches the ledger (the
    # shipped 200 ms batches): wait for the row too, not only the count. A CI run
    # under load read the row still "running" 0 ms after the count appeared.
    with contextlib.suppress(AssertionError):  # the figures below say what happened
        wait_until(ended, timeout=40, every=0.5)
    row = Job.objects.get(message_id=message.message_id)
    left = {
        "queue": replica.lrange("dramatiq:long", 0, -1),
        "msgs": replica.hlen("dramatiq:long.msgs"),
        "delayed": replica.hlen("dramatiq:long.DQ.msgs"),
        "acks": {k: replica.smembers(k) for k in replica.keys("dramatiq:__acks__.*")},
    }
    print(f"\nledger row {row.state} after {row.attempts} attempt(s); on the new primary: {left}")
    assert replica.get(f"gated-job:{key}:runs") == b"1", (row.state, left, worker.log()[-4000:])
    return row


@pytest.mark.timeout(180)
@pytest.mark.one_row("sqlite", "a broker-side fault (failover)")
def test_it_retries_a_job_that_failed_while_redis_failed_over(
    sentinel_cluster: SentinelCluster, start_worker: Any, tmp_path: Path
) -> None:
    cluster = sentinel_cluster
    replica = cluster.client(cluster.replica.port)
    worker = start_worker(env=cluster.env, threads=1, queues=("long",))
    worker.wait_for_log(READY)

    # Given a job that a worker fetched (the fetch is on the replica too) and runs
    gate = tmp_path / "gate"
    message = enqueue(cluster, "failover", gate)
    wait_until(lambda: bool(replica.keys("dramatiq:__acks__.*.long")), timeout=15)
    wait_until(lambda: bool(replica.smembers(replica.keys("dramatiq:__acks__.*.long")[0])), 15)

    # When the primary dies, and the job reaches Redis before a replica is promoted
    cluster.replica.process.send_signal(signal.SIGSTOP)
    try:
        cluster.kill_primary()
        gate.touch()
        # (the job fails, so does the enqueue of its retry, and the ledger writer
        # holds the message's ack until Redis answers again)
        wait_until(lambda: "Could not ack" in worker.log(), timeout=60, every=0.2)
    finally:
        cluster.replica.process.send_signal(signal.SIGCONT)
    cluster.wait_until_sentinels_agree(cluster.replica.port, timeout=60)

    # Then the job runs again on the promoted replica and succeeds
    row = ran_again(replica, "failover", message, worker)
    assert row.state == "succeeded"


@pytest.mark.timeout(180)
@pytest.mark.one_row("postgresql", "a broker-side fault (failover)")
def test_a_retry_the_dying_primary_took_is_not_lost(
    sentinel_cluster: SentinelCluster, start_worker: Any, tmp_path: Path
) -> None:
    cluster = sentinel_cluster
    replica = cluster.client(cluster.replica.port)
    # A WAIT of 10 s instead of the shipped 500 ms: the primary is killed while
    # the retry's WAIT is pending, which the test must reach in time.
    env = {**cluster.env, "JOBS_OUTBOX_WAIT_TIMEOUT_MS": "10000"}
    worker = start_worker(env=env, threads=1, queues=("long",))
    worker.wait_for_log(READY)

    # Given a job a worker fetched (the fetch is on the replica too) and runs
    gate = tmp_path / "gate"
    message = enqueue(cluster, "retry", gate, actor="gated_flaky_job")
    wait_until(lambda: bool(replica.keys("dramatiq:__acks__.*.long")), timeout=15)
    wait_until(lambda: bool(replica.smembers(replica.keys("dramatiq:__acks__.*.long")[0])), 15)

    # When its first try fails while the replica lags (stopped), so the primary
    # alone takes the retry, and the primary dies before passing it on
    cluster.replica.process.send_signal(signal.SIGSTOP)
    try:
        gate.touch()
        wait_until(lambda: "Retrying message" in worker.log(), timeout=30, every=0.05)
        cluster.kill_primary()
    finally:
        cluster.replica.process.send_signal(signal.SIGCONT)
    cluster.wait_until_sentinels_agree(cluster.replica.port, timeout=60)

    # Then the job runs again on the promoted replica (which never got the retry)
    # and succeeds: the retry was never confirmed, so the message went back
    row = ran_again(replica, "retry", message, worker)
    wait_until(lambda: Job.objects.get(pk=row.pk).state == "succeeded", timeout=10)
