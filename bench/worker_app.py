"""The bench's worker module: ``dramatiq bench.worker_app --queues bench ...``.

``BENCH_STACK=raw`` is plain Dramatiq (a stock RedisBroker with Dramatiq's
default middleware, or ``jobs.broker.wakeup.WakeupRedisBroker`` with
``BENCH_BROKER=wakeup``); ``BENCH_STACK=django`` is our full stack, configured
by ``DJANGO_SETTINGS_MODULE`` (bench.settings). Each process writes how many
SQL statements and ledger writes it made to ``BENCH_STATS_DIR/<pid>.json`` when
it shuts down: the database cost of one job.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq

from bench.procs import QUEUE, STARTED_KEY
from jobs.broker import redis_broker

STACK = os.environ.get("BENCH_STACK", "raw")


def _statement_counter() -> dict[str, int]:
    from django.db.backends.signals import connection_created

    counts = {"statements": 0}

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        counts["statements"] += 1
        return execute(sql, params, many, context)

    def install(sender: Any, connection: Any, **kwargs: Any) -> None:
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(install, weak=False)
    return counts


class _StatsOnShutdown(dramatiq.Middleware):
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        from jobs.ledger import writer as ledger

        ledger.flush()  # the ledger's last batch belongs to the cost
        directory = os.environ.get("BENCH_STATS_DIR")
        if directory:
            stats = {**self.counts, "ledger_writes": ledger.stats.writes}
            Path(directory, f"{os.getpid()}.json").write_text(json.dumps(stats))


if STACK == "django":
    import django

    django.setup()
    _counts = _statement_counter()
    # Last, so after_worker_shutdown runs first and can flush the ledger.
    dramatiq.get_broker().add_middleware(_StatsOnShutdown(_counts))
else:
    from dramatiq.brokers.redis import RedisBroker

    from jobs.broker.wakeup import WakeupRedisBroker

    _url = os.environ["BENCH_REDIS_URL"]
    if os.environ.get("BENCH_BROKER") == "wakeup":
        dramatiq.set_broker(WakeupRedisBroker(url=_url))
    else:
        dramatiq.set_broker(RedisBroker(url=_url))  # type: ignore[no-untyped-call]


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop(sent_at: float = 0.0) -> None:
    if sent_at:
        # Latency probe: when this job started, for the bench to compare.
        started = time.time()
        redis_broker().client.rpush(STARTED_KEY, json.dumps([sent_at, started]))
