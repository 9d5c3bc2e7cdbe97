"""A concurrency key's Redis data of another type than the platform writes
there (a key written by hand, another application sharing the database): no
job is lost, the jobs of that key fail for good with an error that names the
Redis key, and every other key's jobs, releases and sweeps go on.

Redis does not undo what a script wrote before a command in it failed: a
fetch that popped its jobs and then failed on such a key lost them."""

from __future__ import annotations

import logging

import dramatiq
import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from jobs.broker import queues, redis_broker
from jobs.concurrency import slots
from jobs.ledger import states
from jobs.models import Job
from tests.conftest import join, wait_until
from tests.jobs.concurrency.actors import QUEUE, report, runs, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def _failed() -> list[Job]:
    return list(Job.objects.filter(state=states.FAILED))


def test_jobs_of_a_key_whose_slots_are_another_type_fail_for_good_and_none_is_lost(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], sender: str
) -> None:
    rb = redis_broker()
    rb.client.set(f"{rb.namespace}:__slots__.tenant:t", "x")
    for _ in range(3):
        report.send("t", 0.0)
    report.send("fine", 0.0)
    start_worker(workers, broker, threads=2)
    wait_until(lambda: len(_failed()) == 3, timeout=20)
    join(QUEUE, timeout_ms=20_000)
    for job in _failed():
        assert job.error_type == "ConcurrencyKeyUnusable"
        assert f"{rb.namespace}:__slots__.tenant:t holds a string, not a hash" in job.error_message
    # Dead-lettered (the admin's Retry sends them again once the key is fixed),
    # and the other key's job ran.
    assert rb.client.zcard(f"{rb.namespace}:{QUEUE}.XQ") == 3
    assert [key for key, _, _ in runs] == ["tenant:fine"]
    assert Job.objects.filter(state=states.SUCCEEDED).count() == 1


def test_a_job_that_would_park_on_a_list_of_another_type_fails_for_good(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], sender: str
) -> None:
    # The key is full (two slots of a holder with no heartbeat, in a contact
    # period too young to judge it), so the job would park: its parked list is
    # a string. Before: the job was popped and lost.
    rb = redis_broker()
    ns = rb.namespace
    rb.client.set(f"{ns}:__contact_since__", 2**50)  # (young for ever: no verdict)
    rb.client.hset(f"{ns}:__slots__.tenant:p", mapping={"a": "W:ghost:r1", "b": "W:ghost:r2"})
    rb.client.set(f"{ns}:__parked__.tenant:p", "x")
    report.send("p", 0.0)
    start_worker(workers, broker, threads=2)
    wait_until(lambda: len(_failed()) == 1, timeout=20)
    assert f"{ns}:__parked__.tenant:p holds a string, not a list" in _failed()[0].error_message
    # Nothing of the job was written: not counted as waiting, not in the index.
    assert not rb.client.hgetall(f"{ns}:{slots.PER_QUEUE}")
    assert not rb.client.hgetall(f"{ns}:{slots.PARKED_IDS}")
    assert rb.client.zcard(f"{ns}:{QUEUE}.XQ") == 1


def test_a_release_frees_the_other_keys_of_its_batch(
    broker: dramatiq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.hset(f"{ns}:__slots__.fine", "m1", "W:b:r1:7")
    client.set(f"{ns}:__slots__.broken", "x")
    held = [slots.Held("broken", "m0", 1, "r0", 7), slots.Held("fine", "m1", 1, "r1", 7)]
    with caplog.at_level(logging.WARNING, logger="jobs.concurrency.slots"):
        assert slots.release(client, ns, held, broker_id="b") == 0
    assert slots.holders(client, ns, "fine") == {}
    assert f"{ns}:__slots__.broken holds a string, not a hash" in caplog.text
    # Reported once a while, not once a release: a worker releases many a second.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobs.concurrency.slots"):
        slots.release(client, ns, held[:1], broker_id="b")
    assert "broken" not in caplog.text


def test_a_sweep_frees_dead_holders_slots_past_a_key_of_another_type(
    broker: dramatiq.Broker,
) -> None:
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.hset(f"{ns}:__slots__.dead", "m1", "W:ghost:r1:3")
    client.set(f"{ns}:__slots__.broken", "x")
    client.sadd(f"{ns}:{slots.SLOT_KEYS}", "broken", "dead")
    cursor, _ = slots.sweep(client, ns, timeout_ms=1_000, among=slots.SLOT_KEYS)
    assert cursor == 0
    assert slots.holders(client, ns, "dead") == {}


def _full(ns: str, client: redis.Redis, key: str) -> None:
    """``key`` full: two slots of a holder with no heartbeat, in a contact
    period too young to judge it."""
    client.set(f"{ns}:__contact_since__", 2**50)
    client.hset(f"{ns}:__slots__.{key}", mapping={"a": "W:ghost:r1", "b": "W:ghost:r2"})


@pytest.mark.parametrize("refusal", ["read-only", "out-of-memory"])
@pytest.mark.parametrize("room", ["free", "full"])
def test_a_redis_refusing_writes_refuses_an_acquire_and_fails_no_job(
    broker: dramatiq.Broker, refusal: str, room: str
) -> None:
    # Only the key's own data makes a job fail for good. A refusal of Redis's
    # own (a replica after a failover, a full Redis) raises as before: the
    # consumer hands the job back to be fetched again. Whether the job would
    # take a slot or park (the park's first write is the count of parked jobs).
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    if room == "full":
        _full(ns, client, "tenant:ro")
    client.sadd(f"{ns}:__acks__.{rb.broker_id}.{QUEUE}", "r1")
    before = slots.holders(client, ns, "tenant:ro")
    wanted = [slots.Wanted("tenant:ro", 2, "m1", "r1")]
    policy = str(client.config_get("maxmemory-policy")["maxmemory-policy"])
    if refusal == "read-only":
        client.execute_command("REPLICAOF", "127.0.0.1", "1")  # (a master that never answers)
    else:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
    try:
        with pytest.raises((redis.ReadOnlyError, redis.exceptions.OutOfMemoryError)):
            slots.acquire(
                client, ns, wanted, broker_id=rb.broker_id, queue_name=QUEUE, timeout_ms=60_000
            )
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", policy)
    assert slots.holders(client, ns, "tenant:ro") == before
    assert slots.parked(client, ns, "tenant:ro") == []


def test_a_reservation_without_its_time_is_freed_not_taken_for_damage(
    broker: dramatiq.Broker,
) -> None:
    # A reservation this code never writes ("R:" and no time) in a full key:
    # the prune failed on it (Lua arithmetic on nil), and every job of the key
    # failed for good. It is freed as an expired one would be.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.hset(f"{ns}:__slots__.tenant:j", mapping={"x": "R:1:rx:0", "z": "R:junk"})
    report.send("j", 0.0)
    reply = rb.do_fetch(QUEUE, 1, "slots", 1, report.actor_name, 2, "tenant:{tenant}")
    assert [job.outcome for job in slots.decided(reply.pop(), 1)] == [slots.TAKEN]
    assert "z" not in slots.holders(client, ns, "tenant:j")


def test_a_twin_that_cannot_park_fails_and_the_copy_holding_the_slot_runs_and_frees_it(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], sender: str
) -> None:
    # The same message sent twice: the first copy takes a slot, the second,
    # which waits for it, finds the parked list damaged. Decisions are kept per
    # message id: the second's overwrote the first's, both copies failed, and
    # the first's slot stayed taken for the worker's lifetime.
    rb = redis_broker()
    rb.client.set(f"{rb.namespace}:__parked__.tenant:twin", "x")
    message = report.message("twin", 0.0)
    rb.enqueue(message)
    rb.enqueue(message)
    start_worker(workers, broker, threads=2)
    join(QUEUE, timeout_ms=20_000)
    wait_until(lambda: [key for key, _, _ in runs] == ["tenant:twin"])
    assert rb.client.zcard(f"{rb.namespace}:{QUEUE}.XQ") == 1
    wait_until(lambda: slots.holders(rb.client, rb.namespace, "tenant:twin") == {})


def test_a_count_of_parked_jobs_that_is_not_a_number_parks_nothing_half_way(
    broker: dramatiq.Broker,
) -> None:
    # The park wrote the job's entry, then failed on the count: the job was
    # both handed out (to fail) and parked, and would have run a second time.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    _full(ns, client, "tenant:n")
    client.hset(f"{ns}:{slots.PER_QUEUE}", QUEUE, "oops")
    report.send("n", 0.0)
    reply = rb.do_fetch(QUEUE, 1, "slots", 1, report.actor_name, 2, "tenant:{tenant}")
    [job] = slots.decided(reply.pop(), 1)
    assert job.outcome == slots.UNUSABLE
    assert f"{ns}:{slots.PER_QUEUE} holds a count for queue {QUEUE}" in job.reason
    assert len(reply) == 1  # handed out, to fail for good
    assert slots.parked(client, ns, "tenant:n") == []


@pytest.mark.parametrize("damage", ["an index of another type", "a count that is no number"])
def test_an_unpark_keeps_the_job_when_a_key_it_writes_is_damaged(
    broker: dramatiq.Broker, damage: str
) -> None:
    # A freed slot hands itself to the parked job: the script pops the entry,
    # then writes the indexes of parked jobs. With one damaged, the job was
    # popped and lost; it now waits where it was, until the key is repaired.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.set(f"{ns}:__contact_since__", 2**50)
    client.hset(f"{ns}:__slots__.tenant:w", mapping={"a": "W:b:r1:7", "b": "W:ghost:r2"})
    report.send("w", 0.0)
    reply = rb.do_fetch(QUEUE, 1, "slots", 1, report.actor_name, 2, "tenant:{tenant}")
    assert [job.outcome for job in slots.decided(reply.pop(), 1)] == [slots.PARKED_NOW]
    if damage == "an index of another type":
        damaged = f"{ns}:__parked_since__.{QUEUE}"
        client.set(damaged, "x")
    else:
        damaged = f"{ns}:{slots.PER_QUEUE}"
        client.hset(damaged, QUEUE, "oops")
    assert slots.release(client, ns, [slots.Held("tenant:w", "a", 2, "r1", 7)], broker_id="b") == 0
    assert len(slots.parked(client, ns, "tenant:w")) == 1
    assert client.hlen(f"{ns}:{slots.PARKED_IDS}") == 1
    assert client.llen(f"{ns}:{QUEUE}") == 0
    # Once repaired, the next release or sweep starts it.
    client.delete(damaged)
    assert slots.sweep(client, ns, timeout_ms=60_000)[1] == 1
    assert client.llen(f"{ns}:{QUEUE}") == 1


def test_a_damaged_index_of_parked_keys_leaves_the_sweep_of_slot_keys_going(
    broker: dramatiq.Broker,
) -> None:
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.hset(f"{ns}:__slots__.dead", "m1", "W:ghost:r1:3")
    client.sadd(f"{ns}:{slots.SLOT_KEYS}", "dead")
    client.set(f"{ns}:{slots.PARKED_KEYS}", "x")
    assert slots.sweep(client, ns, timeout_ms=1_000, among=slots.PARKED_KEYS) == (0, 0)
    slots.sweep(client, ns, timeout_ms=1_000, among=slots.SLOT_KEYS)
    assert slots.holders(client, ns, "dead") == {}


def test_a_job_handed_back_meanwhile_is_not_failed_for_its_damaged_key(
    broker: dramatiq.Broker,
) -> None:
    # Maintenance handed the job back (this worker judged dead): it is no
    # longer this worker's, so whatever its key, another worker decides.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    _full(ns, client, "tenant:h")
    client.set(f"{ns}:__parked__.tenant:h", "x")
    [outcome] = slots.acquire(
        client,
        ns,
        [slots.Wanted("tenant:h", 2, "m1", "r-gone")],
        broker_id=rb.broker_id,
        queue_name=QUEUE,
        timeout_ms=60_000,
    )
    assert outcome.outcome == slots.NOT_OURS


def test_the_console_and_the_queue_figures_read_damaged_concurrency_data_as_none(
    broker: dramatiq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    # The dashboard, the job list, the metrics and the watchdog read the
    # platform's parked counts and indexes. Written over by hand, they made
    # each of them fail (a 500, a traceback): they now read as none, reported.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    message = report.send("w", 0.0)
    Job.objects.update_or_create(
        message_id=message.message_id,
        defaults={"actor_name": report.actor_name, "queue_name": QUEUE, "state": states.ENQUEUED},
    )
    client.set(f"{ns}:{slots.PARKED_KEYS}", "x")
    client.set(f"{ns}:{slots.PARKED_IDS}", "x")
    client.hset(f"{ns}:{slots.PER_QUEUE}", QUEUE, "oops")
    client.set(f"{ns}:{slots.PARKED_SINCE}{QUEUE}", "x")
    with caplog.at_level(logging.ERROR, logger="jobs.concurrency.slots"):
        stats = queues.queue_stats(QUEUE)
    assert (stats.waiting, stats.parked) == (1, 0)
    assert f"{ns}:{slots.PER_QUEUE} '{QUEUE}' holds b'oops', not a count" in caplog.text
    User.objects.create_superuser("root", "root@example.com", "pw")
    console = Client()
    console.login(username="root", password="pw")
    for page in ("/admin/jobs/job/dashboard/", "/admin/jobs/job/?state__exact=enqueued"):
        assert console.get(page).status_code == 200, page
