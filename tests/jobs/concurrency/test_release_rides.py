"""Slot releases that ride with the acks (``Concurrency.ride_along``): where
acks wait for the job ledger, the writer's round trip carries the pending
releases, and the job-slots thread leaves them to it while it goes often."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dramatiq
import pytest

from jobs.broker import redis_broker
from jobs.concurrency import keys, slots
from jobs.middleware import concurrency
from tests.conftest import wait_until
from tests.jobs.concurrency.actors import pack, runs, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def _carrier(broker: dramatiq.Broker) -> concurrency.Concurrency:
    return next(m for m in broker.middleware if isinstance(m, concurrency.Concurrency))


def _idle_worker(broker: dramatiq.Broker, workers: list[dramatiq.Worker]) -> None:
    """A worker on a queue nothing is sent to: a running job-slots thread."""
    worker = dramatiq.Worker(broker, queues={"idle-test"}, worker_timeout=50, worker_threads=1)
    worker.start()
    workers.append(worker)


def _take_slot(key: str, message_id: str) -> slots.Held:
    b = redis_broker()
    wanted = slots.Wanted(key, 1, message_id, f"r-{message_id}")
    outcomes = slots.acquire(
        b.client, b.namespace, [wanted], broker_id=b.broker_id, queue_name="q", timeout_ms=60_000
    )
    assert outcomes == [slots.Outcome(slots.TAKEN, None)]
    return slots.Held(key, message_id, 1, f"r-{message_id}")


def test_a_finished_jobs_slot_goes_with_its_ack(
    broker: dramatiq.Broker,
    workers: list[dramatiq.Worker],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Acks held for the ledger's batch (the shipped 200 ms; tests/conftest.py
    # writes each event at once, which sends each ack at once). The thread's own
    # gathering is 5 s here: only the acks' round trip can free the slot sooner.
    settings.JOBS_LEDGER_FLUSH_MS = 200
    monkeypatch.setattr(concurrency, "LAZY_GATHER", 5.0)
    b = redis_broker()
    start_worker(workers, broker, threads=2)
    pack.send(1, 0.0)
    wait_until(lambda: len(runs) == 1)
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:1"), timeout=2.0)
    assert _carrier(broker)._last_ride > 0, "freed, but not by a ride with the acks"


def test_a_ride_redis_refused_is_sent_by_the_thread_and_only_once(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker]
) -> None:
    # A Redis that lost its scripts (restarted, promoted) answers the ride's
    # EVALSHA with NOSCRIPT: the acks' retry must not drop the releases it
    # took, and a release Redis ran is not sent again.
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    held = _take_slot("order:7", "m7")
    with carrier._lock:  # pending, without waking the thread (its gathering is 20 ms)
        carrier._pending.append(held)
    b.client.script_flush()
    assert b.send_held_acks([]) == []
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:7"), timeout=2.0)
    assert not carrier._pending

    # Ran once: a second copy of the same message, parked behind the first
    # and handed the slot by its release, keeps its reservation.
    held = _take_slot("order:8", "m8")
    again = slots.Wanted("order:8", 1, "m8", "r-again")
    # Fetched by "other" from queue q, whose payloads hold it.
    b.client.sadd(f"{b.namespace}:__acks__.other.q", "r-again")
    b.client.hset(f"{b.namespace}:q.msgs", "r-again", "{}")
    parked = slots.acquire(
        b.client, b.namespace, [again], broker_id="other", queue_name="q", timeout_ms=60_000
    )
    assert parked == [slots.Outcome(slots.PARKED_NOW, None)]
    with carrier._lock:
        carrier._pending.append(held)
    assert b.send_held_acks([]) == []
    reserved = slots.holders(b.client, b.namespace, "order:8")
    assert list(reserved) == ["m8"]
    assert reserved["m8"].startswith("R"), reserved
    time.sleep(0.3)  # the thread's gathering, had the release gone back to it
    assert slots.holders(b.client, b.namespace, "order:8") == reserved


def test_the_thread_leaves_releases_to_frequent_acks_for_a_bounded_time(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shipped: 20 ms alone, up to 100 ms while the acks ride. Scaled up here so
    # that which bound applied shows without timing it closely.
    monkeypatch.setattr(concurrency, "LAZY_GATHER", 0.1)
    monkeypatch.setattr(concurrency, "RIDE_GATHER", 1.5)
    monkeypatch.setattr(concurrency, "RIDING", 60.0)
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    monkeypatch.setattr(carrier, "_last_ride", 0.0)

    def pending_release(key: str) -> None:
        held = _take_slot(key, key)
        with carrier._lock:
            carrier._pending.append(held)
        carrier._wake.set()

    # No ride yet: the thread sends it after its own gathering.
    pending_release("order:20")
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:20"), timeout=1.0)
    # The acks rode moments ago: the thread leaves it to them, but not forever.
    carrier._last_ride = time.monotonic()
    pending_release("order:21")
    time.sleep(0.8)
    assert slots.holders(b.client, b.namespace, "order:21"), "sent before the acks could take it"
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:21"), timeout=2.0)


def test_a_ride_refused_while_the_worker_stops_is_still_sent(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ledger writer sends the last acks while the worker stops: the ride
    # took the releases before the job-slots thread ended, and Redis (which
    # lost its scripts) refuses it. Nobody is left to send them but the
    # writer's own call; left alone, the slot stayed this worker's until the
    # verdict on it, 15 s after it stopped beating.
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    held = _take_slot("order:30", "m30")
    with carrier._lock:
        carrier._pending.append(held)
    pipeline = b.client.pipeline

    def stopping_meanwhile(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def execute_as_it_stops(*args: Any, **kwargs: Any) -> Any:
            carrier.after_worker_shutdown(broker, workers[0])
            b.client.script_flush()
            return execute(*args, **kwargs)

        monkeypatch.setattr(pipe, "execute", execute_as_it_stops)
        return pipe

    monkeypatch.setattr(b.client, "pipeline", stopping_meanwhile)
    assert b.send_held_acks([]) == []
    assert carrier._thread is not None
    assert not carrier._thread.is_alive()
    assert not slots.holders(b.client, b.namespace, "order:30")


def _calls(
    monkeypatch: pytest.MonkeyPatch, carrier: concurrency.Concurrency, method: str
) -> list[tuple[float, tuple[Any, ...]]]:
    """Each call of ``carrier``'s ``method`` from now on: when (monotonic), and
    its arguments. The method still runs."""
    calls: list[tuple[float, tuple[Any, ...]]] = []
    real = getattr(carrier, method)

    def recorded(*args: Any) -> Any:
        calls.append((time.monotonic(), args))
        return real(*args)

    monkeypatch.setattr(carrier, method, recorded)
    return calls


def _stream(broker: dramatiq.Broker, seconds: float, ack_every: float) -> int:
    """Keyed jobs ending steadily (a release every 5 ms) for ``seconds``, and
    the ledger writer's acks every ``ack_every`` seconds; the releases made."""
    b, carrier = redis_broker(), _carrier(broker)
    # Loaded, as after a worker's first release: a ride that meets NOSCRIPT
    # goes back to the thread (the test above).
    b.client.script_load(slots.RELEASE.source)
    next_ack = end = time.monotonic()
    end += seconds
    released = 0
    while time.monotonic() < end:
        if time.monotonic() >= next_ack:
            assert b.send_held_acks([]) == []
            next_ack += ack_every
        message = dramatiq.MessageProxy(pack.message(released, 0.0))
        # (Keys no other test saw waited for: a release of one goes at once.)
        keys.remember_key(message, f"order:stream-{released}", 1)
        carrier.after_process_message(b, message)
        released += 1
        time.sleep(0.005)
    assert b.send_held_acks([]) == []
    return released


def test_while_the_acks_keep_coming_every_release_rides_with_them(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each ack takes every release pending then, so none waits long enough
    # for the thread to send it. Before, the thread sent what was pending
    # whenever its gathering ended (100 ms after it began): about half the
    # releases of 2 processes x 8 threads, each in a round trip of its own.
    # RIDE_GATHER is 0.5 s here (shipped: 0.1) so that a slow machine's gap
    # between two acks does not count.
    monkeypatch.setattr(concurrency, "RIDE_GATHER", 0.5)
    _idle_worker(broker, workers)
    carrier = _carrier(broker)
    sends = _calls(monkeypatch, carrier, "_send")
    released = _stream(broker, 2.0, ack_every=0.05)
    sent = [len(held) for _, (_, held) in sends]
    assert sent == [], f"the thread sent {sum(sent)} of {released} releases itself"
    assert not carrier._pending


def test_a_steady_stream_of_releases_does_not_hold_off_the_sweep(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep (dead holders' slots, the jobs parked behind them) runs once a
    # second, after the thread's gathering. Acks every 0.2 s, each taking every
    # release, and a release every 5 ms: one is nearly always pending and none
    # is ever 0.5 s old (RIDE_GATHER, scaled up from 0.1 s so that this holds
    # on a slow machine too). The gathering went on as long as the stream did.
    monkeypatch.setattr(concurrency, "RIDE_GATHER", 0.5)
    _idle_worker(broker, workers)
    swept = _calls(monkeypatch, _carrier(broker), "_sweep")
    time.sleep(concurrency.SWEEP_INTERVAL)  # (a gathering under way ends meanwhile)
    start = time.monotonic()
    _stream(broker, 3.0, ack_every=0.2)
    during = [t for t, _ in swept if t >= start + 0.1]
    assert len(during) >= 2, f"{len(during)} sweep(s) in 3 s of releases"


def test_a_ride_handed_back_as_the_thread_ends_is_sent_not_stranded(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ledger writer's last acks go after the job-slots thread is told to
    # stop (Dramatiq runs shutdown hooks in reverse order). A ride Redis
    # refused comes back (``ride_back``): the thread was alive when checked,
    # ended before the releases were added, and they stayed in a list nobody
    # sent; the slot stayed this worker's until the verdict on it, 15 s after
    # it stopped beating. The writer is slowed between the two here.
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    held = _take_slot("order:strand", "strand")
    lock = carrier._lock

    class SlowForTheWriter:
        def __enter__(self) -> Any:
            if threading.current_thread().name == "writer":
                time.sleep(0.5)
            return lock.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            return lock.__exit__(*exc)

    monkeypatch.setattr(carrier, "_lock", SlowForTheWriter())
    writer = threading.Thread(target=carrier.ride_back, args=([held], b), name="writer")
    writer.start()
    time.sleep(0.1)
    carrier.after_worker_shutdown(broker, workers[0])
    writer.join()
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:strand"), timeout=2.0)


def test_a_release_jobs_wait_for_goes_at_once_even_at_the_sweeps_time() -> None:
    # The gathering ends at the next sweep's time; a release of a key with
    # jobs waiting (``_urgent``) that came just then lost its fast path: the
    # thread swept, cleared the flag, and let the release gather 20-100 ms.
    carrier = concurrency.Concurrency()
    carrier._pending.append(slots.Held("order:1", "m1", 1, "r1", 1))
    carrier._pending_since = time.monotonic()
    carrier._urgent.set()
    assert carrier._gather(until=time.monotonic() - 0.001) is True


def test_a_batch_redis_keeps_refusing_does_not_hold_off_the_sweep(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A release Redis refuses each time stays pending and is sent again every
    # 0.2 s. The sweep ran in the same step, after the send, and never came: a
    # dead worker's slot of another key stayed taken. (A key's data of another
    # type no longer refuses a batch, test_misfit_keys; what is left, a replica
    # that turned read-only, refuses the sweep too. Here one batch is refused:
    # its argument is sent unreadable, and the script fails in Redis.)
    release_args = slots.release_args

    def unreadable(held: list[slots.Held], *, broker_id: str) -> list[str | int]:
        args = release_args(held, broker_id=broker_id)
        return [args[0], "not json"] if held[0].key == "order:poisoned" else args

    monkeypatch.setattr(slots, "release_args", unreadable)
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    with carrier._lock:
        carrier._pending.append(slots.Held("order:poisoned", "p1", 1, "r-p1", 1))
        carrier._pending_since = time.monotonic()
    carrier._wake.set()
    b.client.hset(f"{b.namespace}:{slots.SLOTS}order:9", "killed-job", "W:ghost:redis-id")
    b.client.sadd(f"{b.namespace}:{slots.SLOT_KEYS}", "order:9")
    b.client.set(f"{b.namespace}:__contact_since__", 0)  # a contact period old enough to judge
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:9"), timeout=5.0)
    # Still pending, to be sent again (taken for a moment at each attempt).
    wait_until(lambda: bool(carrier._pending), timeout=1.0)


def test_a_release_that_fails_outside_redis_does_not_strand_the_rest_at_shutdown(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A release that fails before it reaches Redis (a key with a lone
    # surrogate, which redis-py cannot encode) is lost, as it always was; the
    # releases behind it must still go as the worker stops. The thread took any
    # failure for Redis refusing and ended with them unsent: their slots stayed
    # taken until the verdict on the stopped worker, 15 s later.
    monkeypatch.setattr(concurrency, "RELEASES_PER_CALL", 1)  # (one batch each)
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    good = _take_slot("order:behind", "behind")
    with carrier._lock:
        carrier._pending += [slots.Held("order:\ud800", "bad", 1, "r-bad", 1), good]
        carrier._pending_since = time.monotonic()
    carrier.after_worker_shutdown(broker, workers[0])
    assert not slots.holders(b.client, b.namespace, "order:behind")


def test_releases_a_read_only_redis_refuses_are_reported_once_not_every_attempt(
    broker: dramatiq.Broker, workers: list[dramatiq.Worker], caplog: pytest.LogCaptureFixture
) -> None:
    # A failover's read-only Redis refuses every release for as long as it
    # lasts; the thread tries again every 0.2 s. It logged each attempt.
    _idle_worker(broker, workers)
    b, carrier = redis_broker(), _carrier(broker)
    carrier._last_warning = float("-inf")  # (the middleware outlives tests that warned)
    held = _take_slot("order:ro", "ro")
    b.client.execute_command("REPLICAOF", "127.0.0.1", "1")  # (a master that never answers)
    try:
        with caplog.at_level(logging.WARNING, logger="jobs.middleware.concurrency"):
            with carrier._lock:
                carrier._pending.append(held)
                carrier._pending_since = time.monotonic()
            carrier._urgent.set()
            carrier._wake.set()
            time.sleep(1.5)  # (several attempts, 0.2 s apart)
    finally:
        b.client.execute_command("REPLICAOF", "NO", "ONE")
    assert caplog.text.count("Slots not freed yet") == 1
    # And the release goes once Redis takes writes again.
    wait_until(lambda: not slots.holders(b.client, b.namespace, "order:ro"), timeout=5.0)
