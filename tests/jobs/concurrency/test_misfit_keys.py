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

from jobs.broker import redis_broker
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


def test_a_parked_job_is_kept_when_its_queues_index_is_another_type(
    broker: dramatiq.Broker,
) -> None:
    # A freed slot hands itself to the parked job: the script pops the entry
    # and then writes the index of parked jobs of its queue. With that index
    # a string, the job was popped and lost; it now waits where it was.
    rb = redis_broker()
    client, ns = rb.client, rb.namespace
    client.set(f"{ns}:__contact_since__", 2**50)
    client.hset(f"{ns}:__slots__.tenant:w", mapping={"a": "W:b:r1:7", "b": "W:ghost:r2"})
    report.send("w", 0.0)
    reply = rb.do_fetch(QUEUE, 1, "slots", 1, report.actor_name, 2, "tenant:{tenant}")
    assert [job.outcome for job in slots.decided(reply.pop(), 1)] == [slots.PARKED_NOW]
    client.set(f"{ns}:__parked_since__.{QUEUE}", "x")
    assert slots.release(client, ns, [slots.Held("tenant:w", "a", 2, "r1", 7)], broker_id="b") == 0
    assert len(slots.parked(client, ns, "tenant:w")) == 1
    assert client.llen(f"{ns}:{QUEUE}") == 0
    # Once the index is repaired, the next release or sweep starts it.
    client.delete(f"{ns}:__parked_since__.{QUEUE}")
    assert slots.sweep(client, ns, timeout_ms=60_000)[1] == 1
    assert client.llen(f"{ns}:{QUEUE}") == 1
