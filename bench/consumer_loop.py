"""The wake-up consumer under load, against the polling one, per message.

Wake-up on against off is a target "under load" (issue 17), and under load a
worker's consumer always finds messages: the wake-up path (BLPOP on the wake
list) only runs when a fetch comes back empty. What remains is the consumer's
per-message path: ``_WakeupConsumer._next`` in front of
``LedgerOrderedConsumer._next``. Whole drains cannot show a 2% difference on
two cores: drains of the same code by 2x8 worker processes spread by a fifth
from one to the next (GIL hand-offs among ~10 busy threads per process), so
``throughput`` prints its wake-up rows without a target and this scenario
measures the code that differs, alone.

One thread, no worker: each consumer takes messages from a full queue (fetch
by its prefetch, hand out, decode) and its acks go in batches through the
broker's ``send_held_acks``, as the ledger writer sends them. Chunks of both
variants alternate (the speed of a shared VM drifts over seconds); each chunk
starts after a garbage collection with the collector off, so a collection of
the bench process's heap lands in neither variant.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from bench import procs
from bench.registry import Context, Row, measured
from jobs.broker.acks import HeldAck, LedgerOrderedConsumer
from jobs.broker.wakeup import WakeupRedisBroker

PREFETCH = 16  # the bench's workers: 8 threads, Dramatiq's default of twice that
CHUNK = 320  # messages per timed chunk: 20 fetches
ACK_BATCH = 150  # jobs per ledger transaction in the throughput runs (README)
TARGET = 0.98


@contextmanager
def _no_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _chunk_seconds(broker: WakeupRedisBroker, filler: WakeupRedisBroker, n: int) -> float:
    """Fill the queue with ``n`` messages (not timed), then time a new consumer
    taking and acking them all."""
    procs.enqueue_pipelined(filler, (procs.bench_message() for _ in range(n)))
    consumer = broker.consume(procs.QUEUE, prefetch=PREFETCH, timeout=1000)
    assert isinstance(consumer, LedgerOrderedConsumer)  # (_WakeupConsumer is one too)
    held: list[HeldAck] = []
    taken = 0
    with _no_collection():
        started = time.perf_counter()
        while taken < n:
            message = next(consumer)
            if message is None:  # a wait: the queue was never short, so not expected
                continue
            taken += 1
            consumer.held_ids.add(message.message_id)
            held.append((consumer, message, "ack"))
            if len(held) == ACK_BATCH:
                broker.send_held_acks(held)
                held = []
        if held:
            broker.send_held_acks(held)
        return time.perf_counter() - started


@measured(
    "consumer-loop",
    "wake-up consumer vs wake-up off over a full queue: fetch, hand out and batched ack"
    " per message (the code wake-up changes under load)",
)
def consumer_loop(context: Context) -> list[Row]:
    url = settings.BROKER_REDIS_URL
    on = WakeupRedisBroker(url=url, instant_wakeup=True)
    off = WakeupRedisBroker(url=url, instant_wakeup=False)
    # Fills like the throughput runs: no wake-up tokens, Dramatiq's dispatch.
    filler = WakeupRedisBroker(url=url, instant_wakeup=False)
    chunks = 5 if context.quick else 60
    rates: dict[str, list[float]] = {"on": [], "off": []}
    try:
        _chunk_seconds(on, filler, CHUNK)  # warm up: connections, script cache
        _chunk_seconds(off, filler, CHUNK)
        for _ in range(context.runs):
            spent = {"on": 0.0, "off": 0.0}
            for _ in range(chunks):
                spent["off"] += _chunk_seconds(off, filler, CHUNK)
                spent["on"] += _chunk_seconds(on, filler, CHUNK)
            for name, seconds in spent.items():
                rates[name].append(chunks * CHUNK / seconds)
    finally:
        filler.client.flushdb()
    on_rate, off_rate = statistics.median(rates["on"]), statistics.median(rates["off"])
    ratio = on_rate / off_rate
    return [
        Row(
            "wake-up consumer",
            f"{on_rate:,.0f} msg/s",
            "wake-up off",
            f"{off_rate:,.0f} msg/s",
            f"{ratio:.2f}x",
            f">= {TARGET:.2f}x",
            ratio >= TARGET,
        )
    ]
