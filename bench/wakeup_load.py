"""What instant wake-up costs under load, on the two paths it changes.

Under load no consumer waits: every fetch finds messages, so the wake-up
consumer's own path (BLPOP on the wake list where the polling consumer sleeps)
never runs. What wake-up still changes there is, per message, the consumer's
path from its cache to the worker, and, per enqueue, the script's look at the
wake list (no token while the list is full, as it stays while nobody waits).
Whole drains cannot show a 2% difference on two cores: drains of the same code
by 2x8 worker processes spread by a fifth from one to the next, so
``throughput`` prints its wake-up rows without a target and this scenario
times the two paths alone, in one thread:

- consumer: each consumer takes messages from a full queue (fetch by the
  prefetch, hand out, decode) and sends their acks in batches through the
  broker's ``send_held_acks``, as the ledger writer does;
- enqueue: ``do_enqueue`` of one message at a time (the script a send runs)
  with the wake list full.

Chunks of both variants alternate, and which goes first flips each time (the
speed of a shared VM drifts over seconds); each chunk runs with the garbage
collector off after a collection, so a collection of the bench process's heap
lands in neither variant. The ratio is the median of the runs' ratios.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import dramatiq
from django.conf import settings

from bench import procs
from bench.registry import Context, Row, measured
from jobs.broker.acks import HeldAck, LedgerOrderedConsumer
from jobs.broker.wakeup import WAKE_LIST_MAX, WakeupRedisBroker

PREFETCH = 16  # the bench's workers: 8 threads, Dramatiq's default of twice that
CHUNK = 320  # messages per timed chunk: 20 fetches
# jobs per ledger transaction in the throughput runs (docs/explanation/performance.md)
ACK_BATCH = 150
TARGET = 0.98

# seconds for one chunk of (variant, n messages)
Chunk = Callable[[WakeupRedisBroker, int], float]


@contextmanager
def _no_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _noop() -> None:
    """The bench messages' actor (only its name matters: nothing runs it here)."""


def consumer_seconds(broker: WakeupRedisBroker, n: int, *, filler: WakeupRedisBroker) -> float:
    """Fill the queue with ``n`` messages through ``filler`` (not timed), then
    time a new consumer taking and acking them all."""
    if "noop" not in broker.actors:
        # A consumer hands out only messages of actors its process knows (the
        # others go back for a worker that does: jobs.broker.unknown_actors).
        dramatiq.actor(broker=broker, actor_name="noop", queue_name=procs.QUEUE)(_noop)
    procs.enqueue_pipelined(filler, (procs.bench_message() for _ in range(n)))
    consumer = broker.consume(procs.QUEUE, prefetch=PREFETCH, timeout=1000)
    assert isinstance(consumer, LedgerOrderedConsumer)
    held: list[HeldAck] = []
    with _no_collection():
        started = time.perf_counter()
        for _ in range(n):
            message = next(consumer)
            if message is None:  # it waited: the queue ran short, the figure is void
                raise RuntimeError(f"{n} messages were queued, the consumer found fewer")
            consumer.held_ids.add(message.message_id)
            held.append((consumer, message, "ack"))
            if len(held) == ACK_BATCH:
                broker.send_held_acks(held)
                held = []
        if held:
            broker.send_held_acks(held)
        return time.perf_counter() - started


def enqueue_seconds(broker: WakeupRedisBroker, n: int) -> float:
    """Time ``n`` enqueues of one message each; then drop the queue (not timed)."""
    data = procs.bench_message().encode()
    with _no_collection():
        started = time.perf_counter()
        for number in range(n):
            broker.do_enqueue(procs.QUEUE, str(number), data)
        elapsed = time.perf_counter() - started
    queue = f"{broker.namespace}:{procs.QUEUE}"
    broker.client.delete(queue, f"{queue}.msgs")
    return elapsed


def _row(
    label: str, chunk: Chunk, on: WakeupRedisBroker, off: WakeupRedisBroker, context: Context
) -> Row:
    chunks = 6 if context.quick else 150
    chunk(on, CHUNK)  # warm up: connections, script cache
    chunk(off, CHUNK)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    ratios = []
    for _ in range(context.runs):
        spent = {"on": 0.0, "off": 0.0}
        for index in range(chunks):
            order = ("off", "on") if index % 2 == 0 else ("on", "off")
            for name in order:
                spent[name] += chunk(on if name == "on" else off, CHUNK)
        for name, seconds in spent.items():
            rates[name].append(chunks * CHUNK / seconds)
        ratios.append(spent["off"] / spent["on"])
    ratio = statistics.median(ratios)
    return Row(
        label,
        f"{statistics.median(rates['on']):,.0f} msg/s",
        "wake-up off",
        f"{statistics.median(rates['off']):,.0f} msg/s",
        # Three places: a ratio just under the target must not print as the target.
        f"{ratio:.3f}x",
        f">= {TARGET:.2f}x",
        ratio >= TARGET,
    )


@measured(
    "wakeup-load",
    "instant wake-up on vs off where no consumer waits: a consumer over a full queue"
    " (fetch, hand out, batched acks) and an enqueue with the wake list full",
)
def wakeup_load(context: Context) -> list[Row]:
    url = settings.BROKER_REDIS_URL
    on = WakeupRedisBroker(url=url, instant_wakeup=True)
    off = WakeupRedisBroker(url=url, instant_wakeup=False)
    try:
        # Dramatiq's dispatch, no tokens: as the throughput runs fill their queue.
        filler = WakeupRedisBroker(url=url, instant_wakeup=False)
        timed = partial(consumer_seconds, filler=filler)
        consumer = _row("consumer, full queue", timed, on, off, context)
        on.client.flushdb()
        # Under load nobody takes a token, so the list is full (and stays full:
        # an enqueue only tops it up).
        on.wake(procs.QUEUE, WAKE_LIST_MAX)
        enqueue = _row("enqueue, wake list full", enqueue_seconds, on, off, context)
    finally:
        on.client.flushdb()
    return [consumer, enqueue]
