"""Take tokens (``jobs.concurrency.takes``): a slot is held by one take of a
delivery, freed by that take's release only, and a slot Redis kept after its
release (lost by a failover) is freed by its own worker's sweep."""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
import uuid
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.errors import ConnectionClosed

from jobs.broker import redis_broker
from jobs.broker.acks import LedgerOrderedConsumer
from jobs.concurrency import keys, slots, takes
from jobs.middleware import concurrency
from jobs.middleware.concurrency import Concurrency
from tests.conftest import wait_until
from tests.jobs.concurrency.actors import QUEUE, most_at_once, pack, runs, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_asking_for_its_slot_waits_behind_an_earlier_take_of_its_delivery(
    broker: dramatiq.Broker,
) -> None:
    # The consumer's ACQUIRE (a message without its key: an older sender, a
    # key pattern's limit overridden) for a job handed back and fetched again
    # by the same worker while its earlier take's release is pending (Redis
    # was away). Taken as its own, the job ran, and the late release then
    # freed the slot under it: two jobs of the key at once under a limit of 1.
    rb = redis_broker()
    namespace, client = rb.namespace, rb.client
    key, earlier = "order:stale", f"W:{rb.broker_id}:r1:1"
    client.hset(f"{namespace}:__slots__.{key}", "M", earlier)
    client.hset(f"{namespace}:{QUEUE}.msgs", "r1", "{}")
    client.sadd(f"{namespace}:__acks__.{rb.broker_id}.{QUEUE}", "r1")  # fetched again
    client.zadd(f"{namespace}:__heartbeats__", {rb.broker_id: client.time()[0] * 1000})  # alive
    ask = functools.partial(
        slots.acquire, client, namespace, broker_id=rb.broker_id, queue_name=QUEUE, timeout_ms=60000
    )
    wanted = [slots.Wanted(key, 1, "M", "r1")]
    [(outcome, *_)] = ask(wanted, token=2)
    assert outcome == slots.PARKED_NOW
    assert slots.holders(client, namespace, key) == {"M": earlier}
    # The pending release of take 1 goes: the slot is handed to the job.
    held = [slots.Held(key, "M", 1, "r1", 1)]
    assert slots.release(client, namespace, held, broker_id=rb.broker_id) == 1
    assert slots.holders(client, namespace, key)["M"].startswith("R:")


def test_a_take_asking_again_keeps_its_own_slot(broker: dramatiq.Broker) -> None:
    # The same take asking a second time (its reply lost): its own slot, not a wait.
    rb = redis_broker()
    namespace, client = rb.namespace, rb.client
    client.sadd(f"{namespace}:__acks__.{rb.broker_id}.{QUEUE}", "r1")
    ask = functools.partial(
        slots.acquire, client, namespace, broker_id=rb.broker_id, queue_name=QUEUE, timeout_ms=60000
    )
    wanted = [slots.Wanted("order:again", 1, "M", "r1")]
    for _ in range(2):
        [(outcome, *_)] = ask(wanted, token=5)
        assert outcome == slots.TAKEN
    assert slots.holders(client, namespace, "order:again") == {"M": f"W:{rb.broker_id}:r1:5"}


def test_a_release_sent_again_never_frees_a_later_take_of_its_delivery(
    broker: dramatiq.Broker,
) -> None:
    # Take 1's release went, its reply was lost, and it is sent again; the
    # delivery was fetched again meanwhile and holds the slot under take 2.
    # The second sending must leave take 2's slot alone.
    rb = redis_broker()
    namespace, client = rb.namespace, rb.client
    key = "order:twice"
    client.hset(f"{namespace}:__slots__.{key}", "M", f"W:{rb.broker_id}:r1:2")
    again = [slots.Held(key, "M", 1, "r1", 1)]
    slots.release(client, namespace, again, broker_id=rb.broker_id)
    assert slots.holders(client, namespace, key) == {"M": f"W:{rb.broker_id}:r1:2"}
    # Take 2's own release frees it; so would one that cannot name its take.
    slots.release(client, namespace, [slots.Held(key, "M", 1, "r1", 2)], broker_id=rb.broker_id)
    assert slots.holders(client, namespace, key) == {}
    client.hset(f"{namespace}:__slots__.{key}", "M", f"W:{rb.broker_id}:r1:3")
    slots.release(client, namespace, [slots.Held(key, "M", 1, "r1")], broker_id=rb.broker_id)
    assert slots.holders(client, namespace, key) == {}


def test_the_settled_takes_are_those_neither_held_nor_in_flight() -> None:
    book = takes.Takes()
    first, second = book.call(), book.call()
    assert book.settled() == (second + 1, {first, second})  # both in flight
    book.called(first, ["m1"])
    book.called(second, [])  # its reply lost, or nothing taken
    assert book.settled() == (second + 1, {first})  # m1 still holds its slot
    book.released([("m1", first), ("m1", first)])  # (twice: harmless)
    assert book.settled() == (second + 1, set())
    third = book.call()
    book.called(third, ["m3"])
    book.released([("m3", first)])  # another take's release: not this one's
    assert book.settled() == (third + 1, {third})


def test_a_workers_sweep_frees_its_slots_under_takes_it_released(broker: dramatiq.Broker) -> None:
    # Redis lost a release (a failover before it reached the replica): the
    # slot stays under a live worker, whose heartbeat no verdict questions.
    rb = redis_broker()
    namespace, client = rb.namespace, rb.client
    me = f"sweeper-{uuid.uuid4()}"
    book = takes.of(me)
    lost = book.call()
    book.called(lost, ["m0"])
    book.released([("m0", lost)])  # Redis answered the release, then lost it
    running = book.call()
    book.called(running, ["m1"])
    lost_later = book.call()  # a later take, lost too: a long job delays no other's
    book.called(lost_later, ["m3"])
    book.released([("m3", lost_later)])
    in_flight = book.call()  # a fetch whose reply is on its way
    key = "order:swept"
    now_ms = client.time()[0] * 1000
    client.zadd(f"{namespace}:__heartbeats__", {me: now_ms, "other": now_ms})
    client.hset(
        f"{namespace}:__slots__.{key}",
        mapping={
            "m0": f"W:{me}:r0:{lost}",
            "m1": f"W:{me}:r1:{running}",
            "m2": f"W:{me}:r2:{in_flight}",
            "m3": f"W:{me}:r3:{lost_later}",
            "mo": f"W:other:ro:{lost}",  # another worker's, under the same number
        },
    )
    client.sadd(f"{namespace}:{slots.SLOT_KEYS}", key)
    sweep = functools.partial(
        slots.sweep, client, namespace, timeout_ms=60_000, among=slots.SLOT_KEYS
    )
    sweep()  # a sweep outside any worker frees none
    assert len(slots.holders(client, namespace, key)) == 5
    sweep(broker_id=me)
    assert set(slots.holders(client, namespace, key)) == {"m1", "m2", "mo"}
    book.released([("m1", running)])
    book.called(in_flight, [])
    sweep(broker_id=me)
    assert set(slots.holders(client, namespace, key)) == {"mo"}


@pytest.mark.parametrize(
    "lifetimes", ["one worker", "a second worker outlives the first", "the first stopped twice"]
)
def test_a_slot_redis_kept_after_its_release_is_freed_under_a_live_worker(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], lifetimes: str
) -> None:
    # A job ends and its release goes; Redis then loses it (the holder comes
    # back, as after a failover to a replica that had not received the HDEL).
    # The worker beats on, so no verdict frees the slot: before take tokens,
    # every later job of the key waited until that worker process stopped.
    # Two workers in one process (tests, an embedded worker) share the
    # job-slots thread that sweeps: the first to stop ended it for both.
    rb = redis_broker()
    namespace, client = rb.namespace, rb.client
    start_worker(workers, broker, threads=2)
    if lifetimes != "one worker":
        first_worker = workers.pop()
        start_worker(workers, broker, threads=2)
        first_worker.stop()
        if lifetimes == "the first stopped twice":
            first_worker.stop()
    first = pack.send(7, 0.3)
    wait_until(lambda: slots.holders(client, namespace, "order:7"))
    holder = slots.holders(client, namespace, "order:7")[first.message_id]
    wait_until(lambda: len(runs) == 1 and not slots.holders(client, namespace, "order:7"))
    client.hset(f"{namespace}:__slots__.order:7", first.message_id, holder)
    client.sadd(f"{namespace}:{slots.SLOT_KEYS}", "order:7")
    pack.send(7, 0.0)
    # Freed by the worker's own sweep (one a second); generous bound.
    wait_until(lambda: len(runs) == 2, timeout=10)
    wait_until(lambda: not slots.holders(client, namespace, "order:7"))


def _send_copy_then_twin(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch, message: dramatiq.Message[Any]
) -> None:
    """``message`` sent twice: first as an older sender does (no key in it),
    then with its key, for the fetch to take its slot."""
    with monkeypatch.context() as patched:
        patched.setattr(keys, "send_key", lambda message: None)
        broker.enqueue(message.copy())
    broker.enqueue(message.copy())


def test_a_copy_sent_without_its_key_never_takes_its_twins_slot(
    broker: dramatiq.Broker,
    workers: list[dramatiq.Worker],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The same message twice in one fetch: a copy from an older sender (no key
    # in it: the consumer asks for its slot) and one whose slot the fetch
    # took. The first copy out ran on its twin's slot, and the twin then
    # waited behind its own take until the sweep freed it (a second).
    _send_copy_then_twin(broker, monkeypatch, pack.message(5, 0.3))
    caplog.set_level(logging.INFO, logger="jobs.middleware.concurrency")
    start_worker(workers, broker, threads=4)
    wait_until(lambda: len(runs) == 2, timeout=10)
    assert most_at_once("order:5") == 1
    # The twin started when the first copy's release handed it the slot.
    assert "freed by the sweep" not in caplog.text


def test_a_job_no_take_asked_for_is_handed_back_without_a_release(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A consumer fetched a keyed job it had not asked a slot for yet (its
    # message carries no key) and closes. A release "of any take" of that
    # delivery, held back while Redis was away, freed the slot of the same
    # delivery fetched again and running by the time it went.
    monkeypatch.setattr(keys, "send_key", lambda message: None)
    pack.send(8, 0.0)
    rb = redis_broker()
    consumer = rb.consume(QUEUE, prefetch=1, timeout=100)
    assert isinstance(consumer, LedgerOrderedConsumer)
    assert consumer._fill()  # (fetched, not passed on yet)
    (data,) = consumer.message_cache
    redis_id = dramatiq.Message.decode(data).options["redis_message_id"]
    message_id = dramatiq.Message.decode(data).message_id
    running = f"W:{rb.broker_id}:{redis_id}:99"  # (its take when fetched again)
    rb.client.hset(f"{rb.namespace}:__slots__.order:8", message_id, running)
    consumer.close()
    assert slots.holders(rb.client, rb.namespace, "order:8") == {message_id: running}


def test_a_twins_slot_is_freed_when_its_copy_is_handed_back_first(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of a message sent without its key, then its twin whose slot the
    # fetch took. The copy's ACQUIRE fails (Redis away) and the consumer
    # closes, handing both back: the twin's slot must go with the twin, not be
    # released under the copy's delivery (which frees nothing).
    other = pack.send(6, 0.0)
    _send_copy_then_twin(broker, monkeypatch, pack.message(5, 0.0))
    rb = redis_broker()
    consumer = rb.consume(QUEUE, prefetch=10, timeout=100)
    first = next(consumer)
    assert first is not None
    assert first.message_id == other.message_id
    assert slots.holders(rb.client, rb.namespace, "order:5")  # the twin's, taken by the fetch

    def refused(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("Redis away")

    monkeypatch.setattr(slots, "ACQUIRE", refused)
    with pytest.raises(ConnectionClosed):
        next(consumer)
    monkeypatch.undo()
    consumer.close()
    assert slots.holders(rb.client, rb.namespace, "order:5") == {}


def test_a_keyed_job_its_sender_gave_an_eta_runs_and_leaves_no_slot(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker]
) -> None:
    # Dramatiq's worker holds a message with an eta until then and sends a
    # copy without it, acking the first: that delivery never runs, so its slot
    # was never freed, and the copy waited behind it while the worker lived.
    pack.send_with_options(args=(9, 0.0), eta=int(time.time() * 1000))
    start_worker(workers, broker, threads=2)
    wait_until(lambda: len(runs) == 1, timeout=10)
    rb = redis_broker()
    wait_until(lambda: not slots.holders(rb.client, rb.namespace, "order:9"))


def test_a_worker_booting_while_the_last_one_stops_keeps_a_job_slots_thread(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last worker's shutdown marks the thread stopping; a worker booting
    # in between saw a live thread, kept it, and was left without one.
    middleware = next(m for m in broker.middleware if isinstance(m, Concurrency))
    start_worker(workers, broker, threads=1)
    first = workers.pop()

    class SlowStop(threading.Event):
        def set(self) -> None:
            time.sleep(0.5)  # (widens the window between the last count and the stop)
            super().set()

    monkeypatch.setattr(middleware, "_stop", SlowStop())
    stopping = threading.Thread(target=first.stop)
    stopping.start()
    time.sleep(0.2)
    start_worker(workers, broker, threads=1)
    stopping.join()
    wait_until(lambda: middleware._thread is not None and middleware._thread.is_alive())
    time.sleep(0.3)
    assert middleware._thread is not None
    assert middleware._thread.is_alive()


def test_workers_booting_at_once_start_one_job_slots_thread(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two workers of one process (tests, an embedded worker) booting at the
    # same moment. Each saw no thread running and started one: two threads
    # then swept and sent releases, and a shutdown joined only the last. The
    # thread's start is slowed here so that the two boots overlap on any machine.
    carrier = next(m for m in broker.middleware if isinstance(m, Concurrency))
    before = set(threading.enumerate())

    def slow_thread(*args: Any, **kwargs: Any) -> threading.Thread:
        time.sleep(0.2)
        return threading.Thread(*args, **kwargs)

    slowed = types.SimpleNamespace(**{**vars(threading), "Thread": slow_thread})
    monkeypatch.setattr(concurrency, "threading", slowed)
    stubs: list[Any] = [object(), object()]
    boots = [threading.Thread(target=carrier.before_worker_boot, args=(broker, s)) for s in stubs]
    for boot in boots:
        boot.start()
    for boot in boots:
        boot.join()

    def started() -> list[threading.Thread]:
        return [t for t in set(threading.enumerate()) - before if t.name == "job-slots"]

    try:
        assert len(started()) == 1, started()
    finally:
        for stub in stubs:
            carrier.after_worker_shutdown(broker, stub)
    wait_until(lambda: not started())
