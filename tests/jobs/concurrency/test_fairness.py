"""Fair queueing with a real Redis and real in-process workers: a small tenant's
jobs take turns with a big tenant's backlog instead of waiting behind it, every
job runs once (stops, retries, a marker's second send), and the queue's counts
and purge see the jobs held in key lists."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import dramatiq
import pytest

from jobs.broker import queues, redis_broker, replication
from jobs.concurrency import fairness, slots
from jobs.concurrency.keys import ConcurrencyKeyError
from tests.conftest import join, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = "fair-test"
FIFO = "fifo-test"
started: list[tuple[str, int]] = []  # (tenant, seq) in the order jobs started
started_lock = threading.Lock()
failed_once: set[int] = set()


def _start(tenant: str, seq: int) -> None:
    with started_lock:
        started.append((tenant, seq))


@dramatiq.actor(queue_name=FAIR, max_retries=0, fairness_key="tenant:{tenant}")
def fair_visit(tenant: str, seq: int) -> None:
    _start(tenant, seq)


@dramatiq.actor(queue_name=FAIR, max_retries=0)
def plain_visit(tenant: str, seq: int) -> None:
    _start(tenant, seq)


@dramatiq.actor(queue_name=FIFO, max_retries=0)
def fifo_visit(tenant: str, seq: int) -> None:
    _start(tenant, seq)


@dramatiq.actor(
    queue_name=FAIR, max_retries=2, min_backoff=10, max_backoff=20, fairness_key="tenant:{tenant}"
)
def fair_flaky(tenant: str, seq: int) -> None:
    _start(tenant, seq)
    if seq not in failed_once:
        failed_once.add(seq)
        raise RuntimeError("fails once")


@pytest.fixture(autouse=True)
def _clean() -> None:
    started.clear()
    failed_once.clear()


def _drain(broker: dramatiq.Broker, queue: str, threads: int = 1) -> None:
    worker = dramatiq.Worker(broker, queues={queue}, worker_timeout=50, worker_threads=threads)
    worker.start()
    try:
        join(queue, timeout_ms=60_000)
    finally:
        worker.stop()


def _last_start_of(tenant: str) -> int:
    return max(i for i, (t, _) in enumerate(started) if t == tenant)


def test_a_small_tenant_takes_turns_with_a_big_backlog_instead_of_waiting_behind_it(
    broker: dramatiq.Broker,
) -> None:
    # Given tenant A's 200 jobs sent before tenant B's 10, on a FIFO queue and
    # on a fair one, each run by one worker thread
    for actor in (fifo_visit, fair_visit):
        for seq in range(200):
            actor.send("A", seq)
        for seq in range(10):
            actor.send("B", seq)
    _drain(broker, FIFO)
    fifo_last_b = _last_start_of("B")
    started.clear()
    _drain(broker, FAIR)

    # Then FIFO starts B's last job after all of A's; the fair queue alternates,
    # so B's last starts about 20th (a prefetch of slack), and both keep their
    # own order
    assert fifo_last_b == 209
    assert _last_start_of("B") < 25, started[:30]
    assert [s for t, s in started if t == "A"] == list(range(200))
    assert [s for t, s in started if t == "B"] == list(range(10))
    # And nothing is left behind: no key list, ticket or count
    client = redis_broker().client
    assert not client.keys(f"{redis_broker().namespace}:{FAIR}:*")


def test_the_queue_counts_jobs_in_key_lists_and_a_purge_drops_them(
    broker: dramatiq.Broker,
) -> None:
    for seq in range(30):
        fair_visit.send("A", seq)
    for seq in range(5):
        fair_visit.send("B", seq)
    for seq in range(3):
        plain_visit.send("C", seq)

    # 38 waiting: 3 in the queue's list, 35 in the key lists
    stats = queues.queue_stats(FAIR)
    assert stats.waiting == 38
    assert stats.oldest_waiting_age_s is not None

    broker.flush(FAIR)
    namespace = redis_broker().namespace
    assert not redis_broker().client.keys(f"{namespace}:{FAIR}:*")
    assert queues.queue_stats(FAIR).waiting == 0


def test_a_stopping_worker_hands_back_fair_jobs_and_each_runs_once(
    broker: dramatiq.Broker,
) -> None:
    # Given 40 jobs of two tenants, and a worker stopped after a few ran (its
    # prefetched jobs go back to the queue as plain ids)
    for seq in range(20):
        fair_visit.send("A", seq)
        fair_visit.send("B", seq)
    worker = dramatiq.Worker(broker, queues={FAIR}, worker_timeout=50, worker_threads=2)
    worker.start()
    wait_until(lambda: len(started) >= 3)
    worker.stop()
    # When another worker drains the queue
    _drain(broker, FAIR, threads=2)
    # Then every job ran exactly once
    assert sorted(started) == sorted((t, s) for t in "AB" for s in range(20))


def test_a_retried_fair_job_takes_its_keys_turn_again_and_succeeds(
    broker: dramatiq.Broker,
) -> None:
    for seq in range(5):
        fair_flaky.send("A", seq)
    _drain(broker, FAIR, threads=2)
    assert sorted(started) == sorted([("A", s) for s in range(5)] * 2)
    namespace = redis_broker().namespace
    assert not redis_broker().client.keys(f"{namespace}:{FAIR}:*")


def test_a_fair_send_with_a_marker_is_enqueued_once(broker: dramatiq.Broker) -> None:
    # The outbox's relay sends with a marker: a second send of the same copy
    # must do nothing, fair or not (the key follows the marker's arguments).
    message = fair_visit.message("A", 1)
    for _ in range(2):
        with replication.confirmed_by_replicas(0, 100, marker="fair-test-marker", keep_ms=60_000):
            broker.enqueue(message)
    assert queues.queue_stats(FAIR).waiting == 1
    _drain(broker, FAIR)
    assert started == [("A", 1)]


def test_a_fairness_key_naming_no_argument_fails_at_declaration(broker: dramatiq.Broker) -> None:
    def visit(tenant: str) -> None:
        pass

    expected = re.escape("fairness_key 'org:{org}' names 'org'")
    with pytest.raises(ConcurrencyKeyError, match=expected):
        dramatiq.actor(queue_name=FAIR, fairness_key="org:{org}")(visit)
    assert "visit" not in fairness._declared


def test_messages_without_a_key_take_turns_as_one_key(broker: dramatiq.Broker) -> None:
    for seq in range(40):
        fair_visit.send("A", seq)
    for seq in range(5):
        plain_visit.send("P", seq)
    _drain(broker, FAIR)
    # Every other job while both wait (one thread; a prefetch of slack).
    assert _last_start_of("P") < 14, started[:16]


def test_a_worker_without_fair_queueing_leaves_fair_jobs_to_those_with_it(
    broker: dramatiq.Broker,
) -> None:
    # Given an older release's fetch (dispatch.lua with our clock, without the
    # fairness prefix), as in a rolling deploy, and fair and plain jobs waiting
    from dramatiq.brokers.redis import _scripts

    from jobs.broker import clock

    b = redis_broker()
    old = b.client.register_script(clock.DISPATCH_PREFIX.encode() + _scripts["dispatch"])
    for seq in range(3):
        fair_visit.send("A", seq)
    plain_visit.send("P", 0)
    args = ["fetch", 0, FAIR, "old-worker", b.heartbeat_timeout, b.dead_message_ttl, 0, 1000, 10]
    # When it fetches: it gets the plain job only, never a fair one or a stand-in
    fetched = old(keys=[b.namespace], args=args)
    assert [dramatiq.Message.decode(m).args for m in fetched] == [("P", 0)]
    assert queues.queue_stats(FAIR).waiting == 3
    done = dramatiq.Message.decode(fetched[0]).options["redis_message_id"]
    old(keys=[b.namespace], args=["ack", *args[1:8], done])  # it ran the plain job
    # Then workers that know the key lists run them
    _drain(broker, FAIR)
    assert sorted(started) == [("A", 0), ("A", 1), ("A", 2)]


def test_unwind_moves_fair_jobs_back_for_a_release_without_fair_queueing(
    broker: dramatiq.Broker,
) -> None:
    for seq in range(4):
        fair_visit.send("A", seq)
    fair_visit.send("B", 0)
    b = redis_broker()
    assert fairness.unwind(b.client, b.namespace, FAIR) == 5
    assert not b.client.keys(f"{b.namespace}:{FAIR}:*")
    assert b.client.llen(f"{b.namespace}:{FAIR}") == 5
    _drain(broker, FAIR)
    assert sorted(started) == [("A", s) for s in range(4)] + [("B", 0)]


def test_a_starved_keys_oldest_job_ages_the_queue(broker: dramatiq.Broker) -> None:
    for seq in range(5):
        fair_visit.send("A", seq)
    time.sleep(0.5)
    fair_visit.send("B", 0)
    plain_visit.send("C", 0)
    b = redis_broker()
    for _ in range(2):  # a fetch moves a fresh plain id or key to the front
        b.do_fetch(FAIR, 1)
    age = queues.queue_stats(FAIR).oldest_waiting_age_s
    assert age is not None
    assert age >= 0.5


def test_odd_keys_and_a_queue_named_like_a_fair_key(broker: dramatiq.Broker) -> None:
    # A lone surrogate (JSON allows "\ud800"), a newline, a colon: each is a key.
    for tenant in ("\ud800", "a\nb", "x:fair:k:y"):
        fair_visit.send(tenant, 0)
    # A queue whose name ends as a fair queue's keys do is its own queue.
    b = redis_broker()
    b.declare_queue(f"{FAIR}.fair")
    b.enqueue(plain_visit.message("Q", 0).copy(queue_name=f"{FAIR}.fair"))
    _drain(broker, FAIR)
    assert sorted(t for t, _ in started) == sorted(["\ud800", "a\nb", "x:fair:k:y"])


def test_a_bad_fairness_key_leaves_no_concurrency_key_declared(broker: dramatiq.Broker) -> None:
    from jobs.concurrency import keys

    def both(a: int) -> None:
        pass

    with pytest.raises(ConcurrencyKeyError):
        dramatiq.actor(
            queue_name=FAIR, concurrency_key="zz:{a}", concurrency_limit=1, fairness_key="x:{no}"
        )(both)
    assert "both" not in keys.declared()


def test_jobs_unwind_fair_moves_them_back_and_is_audited(broker: dramatiq.Broker) -> None:
    from jobs.models import AuditEntry
    from tests.jobs.management.test_jobs_command import jobs

    for seq in range(3):
        fair_visit.send("A", seq)
    done = jobs("unwind-fair", FAIR)
    assert done.code == 0, done.err
    assert f"{FAIR}: 3 job(s) moved back" in done.out
    entry = AuditEntry.objects.get(action="unwind-fair")
    assert (entry.count, entry.source) == (3, "cli")
    assert jobs("unwind-fair", "no-such-queue").code == 2
    _drain(broker, FAIR)
    assert sorted(started) == [("A", s) for s in range(3)]


def test_jobs_unwind_fair_all_takes_every_queue_with_key_lists(broker: dramatiq.Broker) -> None:
    from tests.jobs.management.test_jobs_command import jobs

    # One declared fair queue, and one no actor declares any more (its keys
    # renamed from the first): a rollback can leave both. A tenant whose key
    # ends in ":fair" makes a key list the SCAN pattern also matches.
    for seq, tenant in enumerate(["A", "B", "x:fair"]):
        fair_visit.send(tenant, seq)
    b = redis_broker()
    for name in b.client.scan_iter(match=f"{b.namespace}:{FAIR}*"):
        b.client.rename(name, name.replace(FAIR.encode(), b"gone-test", 1))
    fair_visit.send("A", 3)
    # Concurrency slots and parked jobs of a key "tenant:fair" end in ":fair"
    # too: they are no queue's, and must be left as they are.
    slots_of = f"{b.namespace}:{slots.SLOTS}tenant:fair"
    parked_on = f"{b.namespace}:{slots.PARKED}tenant:fair"
    b.client.hset(slots_of, "m-1", "W:b:r-1")
    b.client.rpush(parked_on, "q\nr-2\nm-2\n0")
    assert fairness.unwind(b.client, b.namespace, slots.SLOTS + "tenant") == 0
    assert jobs("unwind-fair", "gone-test").code == 2  # by name: only declared queues
    assert jobs("unwind-fair", "--all", "gone-test").code == 2
    assert jobs("unwind-fair").code == 2  # neither names nor --all
    done = jobs("unwind-fair", "--all")
    assert done.code == 0, done.err
    assert done.out.splitlines() == [
        f"{FAIR}: 1 job(s) moved back into the queue's list.",
        "gone-test: 3 job(s) moved back into the queue's list.",
    ]
    assert b.client.llen(f"{b.namespace}:gone-test") == 3
    assert not b.client.keys(f"{b.namespace}:*-test:fair*")
    assert b.client.hgetall(slots_of) == {b"m-1": b"W:b:r-1"}
    assert b.client.llen(parked_on) == 1
    assert jobs("unwind-fair", "--all").out.strip() == "No fair key lists: nothing to move."


def test_with_fair_queueing_off_sends_are_plain_and_waiting_key_lists_still_run(
    broker: dramatiq.Broker, settings: Any
) -> None:
    # Before a rollback: jobs already in key lists, then the switch off (a
    # setting of this test, not the shipped default).
    for seq in range(3):
        fair_visit.send("A", seq)
    settings.JOBS_FAIR_QUEUEING = False
    for seq in range(3, 6):
        fair_visit.send("A", seq)
    b = redis_broker()
    assert b.client.llen(f"{b.namespace}:{FAIR}") == 3  # plain, as any release reads them
    assert queues.queue_stats(FAIR).waiting == 6
    _drain(broker, FAIR)
    assert sorted(started) == [("A", s) for s in range(6)]


def test_unwind_moves_a_backlog_a_chunk_at_a_time(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fairness, "UNWIND_CHUNK", 3)  # several calls for 11 jobs
    for seq in range(7):
        fair_visit.send("A", seq)
    for seq in range(4):
        fair_visit.send("B", seq)
    b = redis_broker()
    assert fairness.unwind(b.client, b.namespace, FAIR) == 11
    assert not b.client.keys(f"{b.namespace}:{FAIR}:*")
    assert queues.queue_stats(FAIR).waiting == 11
    _drain(broker, FAIR)
    assert sorted(started) == sorted([("A", s) for s in range(7)] + [("B", s) for s in range(4)])


def test_a_keys_oldest_job_is_timed_on_redis_clock_not_the_senders(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.broker import wakeup

    monkeypatch.setattr(wakeup, "current_millis", lambda: int(time.time() * 1000) + 3_600_000)
    fair_visit.send("A", 0)
    b = redis_broker()
    score = b.client.zscore(f"{b.namespace}:{FAIR}:fair:heads", "tenant:A")
    seconds, micros = b.client.time()
    assert score is not None
    assert abs(float(score) - (seconds * 1000 + micros / 1000)) < 5_000
