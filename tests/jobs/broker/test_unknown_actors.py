"""A rolling deploy: a job of an actor the worker does not know yet is put back
for a worker that does, not dead-lettered without a ledger row (issue 29, item 5).

Real Redis, a real in-process worker; the "new version" is an actor declared
while the old worker runs, as a new worker process would have it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dramatiq
import pytest
import redis
from dramatiq.common import dq_name
from dramatiq.errors import ConnectionClosed

from jobs.broker import queues, unknown_actors
from jobs.broker.wakeup import WakeupRedisBroker
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.models import Job
from project.redis_server import RedisServer
from tests.conftest import IDLE_POLL_MS, join, wait_until
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "deploy-test"
NEW_ACTOR = "introduced_by_the_next_deploy"
runs: list[Any] = []


@dramatiq.actor(queue_name=QUEUE, actor_name="deploy_known")
def known() -> None:
    pass


def new_version_message(broker: dramatiq.Broker) -> dramatiq.Message[Any]:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=QUEUE, actor_name=NEW_ACTOR, args=(7,), kwargs={}, options={}
    )
    return broker.enqueue(message)


@pytest.fixture
def deploy(broker: dramatiq.Broker) -> Iterator[None]:
    runs.clear()
    yield
    broker.actors.pop(NEW_ACTOR, None)


def declare_new_actor() -> None:
    @dramatiq.actor(queue_name=QUEUE, actor_name=NEW_ACTOR)
    def introduced(order_id: int) -> None:
        runs.append(order_id)


def test_an_unknown_actors_job_waits_for_a_worker_that_knows_it(
    broker: dramatiq.Broker, settings, deploy: None
) -> None:
    # Put back every 200 ms rather than the shipped 5 s: the test waits less.
    settings.JOBS_PAUSE_RECHECK_MS = 200
    message = new_version_message(broker)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        # The old worker fetches it and puts it back, again and again: not dead.
        wait_until(lambda: queues.queue_stats(QUEUE).delayed + queues.queue_stats(QUEUE).waiting)
        assert queues.queue_stats(QUEUE).dead == 0
        assert runs == []
        # The deploy reaches this worker: the next trip runs it, once.
        declare_new_actor()
        wait_until(lambda: runs == [7], timeout=15)
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()
    job = Job.objects.get(message_id=message.message_id)
    assert (job.state, job.actor_name, job.args) == ("succeeded", NEW_ACTOR, [7])
    assert queues.queue_stats(QUEUE).dead == 0


def test_past_the_wait_it_is_dead_lettered_with_a_ledger_row_and_can_be_retried(
    broker: dramatiq.Broker, settings, deploy: None
) -> None:
    # No wait: dead-lettered at the first fetch (the shipped wait is an hour).
    settings.JOBS_UNKNOWN_ACTOR_WAIT_MS = 0
    message = new_version_message(broker)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        wait_until(lambda: queues.queue_stats(QUEUE).dead == 1, timeout=15)
        ledger.flush()
        job = Job.objects.get(message_id=message.message_id)
        assert (job.state, job.error_type) == ("failed", "ActorNotFound")
        assert "No worker knows actor" in job.error_message
        assert job.args == ["[redacted]"]  # not recorded without the actor's parameter names

        # Once the actor is deployed, the admin's retry runs it.
        declare_new_actor()
        assert operations.retry_jobs(Job.objects.filter(pk=job.pk)).done == 1
        wait_until(lambda: runs == [7], timeout=15)
        join(QUEUE)
    finally:
        worker.stop()


class Killed(BaseException):
    """The worker process dying: nothing after this point reaches Redis."""


def copies_in_redis(broker: Any, message_id: str) -> int:
    """Payloads of ``message_id`` in the queue and its delay queue: each one runs."""
    found = 0
    for queue in (QUEUE, dq_name(QUEUE)):
        for data in broker.client.hvals(f"{broker.namespace}:{queue}.msgs"):
            found += dramatiq.Message.decode(data).message_id == message_id
    return found


def fetch_for(consumer: Any, rounds: int) -> None:
    for _ in range(rounds):
        next(consumer)


def test_a_worker_killed_right_after_a_put_back_leaves_one_copy(
    broker: Any, deploy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kill forced at the worst moment: as the put-back returns. Sent as a copy
    # and then acked, a kill between the two left the fetched message in the
    # dead worker's ack set beside its copy, and both ran once the actor came.
    put_back = unknown_actors.put_back

    def put_back_then_die(*args: Any) -> bool:
        put_back(*args)
        raise Killed

    monkeypatch.setattr(unknown_actors, "put_back", put_back_then_die)
    message = new_version_message(broker)
    consumer = broker.consume(QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    with pytest.raises(Killed):
        fetch_for(consumer, 100)  # a fetch or two reach the put-back

    assert copies_in_redis(broker, message.message_id) == 1


@pytest.fixture
def demoted(redis_server: str, tmp_path: Path) -> Iterator[WakeupRedisBroker]:
    """A broker talking to a primary a failover demoted: a replica of the
    session's Redis."""
    replica = RedisServer(free_port(), tmp_path / "replica", appendonly=False).start()
    try:
        primary = urlsplit(redis_server)
        redis.Redis.from_url(replica.url).replicaof(primary.hostname, primary.port)
        yield WakeupRedisBroker(url=replica.url)
    finally:
        replica.stop()


def put_back_to(demoted: WakeupRedisBroker) -> None:
    data = dramatiq.Message(
        queue_name=QUEUE, actor_name=NEW_ACTOR, args=(), kwargs={}, options={}
    ).encode()
    demoted._enqueue_replacing(dq_name(QUEUE), "copy", data, False, (QUEUE, "fetched"))


def test_a_put_back_refused_by_a_demoted_primary_is_a_lost_connection(
    demoted: WakeupRedisBroker,
) -> None:
    # A single command's READONLY is a lost connection to redis-py's Sentinel
    # client, which then asks the Sentinels again; inside EXEC it was a
    # ReadOnlyError: the consumer thread ended on an unexpected error,
    # connected to the replica.
    with pytest.raises(ConnectionClosed):
        put_back_to(demoted)


@pytest.mark.parametrize("refusal", ["unreachable", "out of memory"])
def test_a_put_back_redis_did_not_take_is_handed_back_by_the_next_consumer(
    broker: Any, deploy: None, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    # Redis went away as the put-back was sent (the fault injected at the
    # broker's edge), or refused it (full: maxmemory set for the put-back only).
    # Before, the fetched message stayed in this live worker's ack set until the
    # process stopped: nobody ran it, nobody put it back.
    put_back = broker._enqueue_replacing

    def unreachable(*args: Any) -> None:
        raise ConnectionClosed(redis.ConnectionError("Connection refused"))  # type: ignore[no-untyped-call]

    def full(*args: Any) -> None:
        before = broker.client.config_get("maxmemory")["maxmemory"]
        broker.client.config_set("maxmemory", 1)
        try:
            put_back(*args)
        finally:
            broker.client.config_set("maxmemory", before)

    message = new_version_message(broker)
    monkeypatch.setattr(
        broker, "_enqueue_replacing", full if refusal == "out of memory" else unreachable
    )
    consumer = broker.consume(QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    with pytest.raises(ConnectionClosed):
        fetch_for(consumer, 100)

    # Redis is back: Dramatiq's consumer thread starts a new consumer
    monkeypatch.undo()
    next(broker.consume(QUEUE, prefetch=1, timeout=IDLE_POLL_MS))
    acks = f"{broker.namespace}:__acks__.{broker.broker_id}.{QUEUE}"
    assert broker.client.smembers(acks) == set()
    assert copies_in_redis(broker, message.message_id) == 1  # put back, once


def test_a_demoted_primarys_refusal_leaves_other_threads_commands_alone(
    demoted: WakeupRedisBroker,
) -> None:
    # Dropping the pool's connections in use broke other threads' commands in
    # flight ("I/O operation on closed file"), which no caller reads as a lost
    # connection: only the idle ones are dropped.
    outcome: list[object] = []

    def wait_on_the_replica() -> None:
        try:
            # A blocking read (a replica refuses BLPOP, a write)
            outcome.append(demoted.client.xread({"nothing-comes": "$"}, block=1000))
        except Exception as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_on_the_replica)
    waiter.start()
    time.sleep(0.2)  # blocked in its XREAD
    with pytest.raises(ConnectionClosed):
        put_back_to(demoted)
    waiter.join(timeout=5)
    assert outcome in ([[]], [None], [{}])  # its XREAD timed out as asked
