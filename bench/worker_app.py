"""The bench's worker module: ``dramatiq bench.worker_app --queues bench ...``.

``BENCH_STACK=raw`` is plain Dramatiq (a stock RedisBroker with Dramatiq's
default middleware, or ``jobs.broker.wakeup.WakeupRedisBroker`` with
``BENCH_BROKER=wakeup``); ``BENCH_STACK=floor`` is raw Dramatiq writing a
minimal row per job (bench.floor); ``BENCH_STACK=django`` is our full stack, configured
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


_HOOKS = (
    "before_process_message",
    "after_process_message",
    "after_skip_message",
    "before_ack",
    "after_ack",
    "before_nack",
    "after_nack",
)


def _time_hooks(broker: dramatiq.Broker) -> dict[str, float]:
    """Wrap each middleware's per-message hooks to add up their time (seconds),
    keyed by middleware class: what each one costs a job (``BENCH_HOOK_TIMES=1``)."""
    spent: dict[str, float] = {}

    def timed(original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def hook(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

        return hook

    for middleware in broker.middleware:
        for hook in _HOOKS:
            if getattr(type(middleware), hook) is getattr(dramatiq.Middleware, hook):
                continue  # not overridden: free
            setattr(middleware, hook, timed(getattr(middleware, hook), type(middleware).__name__))
    return spent


class _StatsOnShutdown(dramatiq.Middleware):
    def __init__(self, counts: dict[str, int], hook_times: dict[str, float]) -> None:
        self.counts = counts
        self.hook_times = hook_times

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        from jobs.ledger import writer as ledger

        ledger.flush()  # the ledger's last batch belongs to the cost
        directory = os.environ.get("BENCH_STATS_DIR")
        if directory:
            stats = {
                **self.counts,
                "ledger_writes": ledger.stats.writes,
                "ledger_write_seconds": ledger.stats.write_seconds,
                "hook_seconds": self.hook_times,
            }
            Path(directory, f"{os.getpid()}.json").write_text(json.dumps(stats))


if STACK == "django":
    import django

    django.setup()
    _counts = _statement_counter()
    _hook_times = _time_hooks(dramatiq.get_broker()) if os.environ.get("BENCH_HOOK_TIMES") else {}
    # Last, so after_worker_shutdown runs first and can flush the ledger.
    dramatiq.get_broker().add_middleware(_StatsOnShutdown(_counts, _hook_times))
else:
    from dramatiq.brokers.redis import RedisBroker

    from jobs.broker.wakeup import WakeupRedisBroker

    _url = os.environ["BENCH_REDIS_URL"]
    if os.environ.get("BENCH_BROKER") == "wakeup":
        dramatiq.set_broker(WakeupRedisBroker(url=_url))
    else:
        dramatiq.set_broker(RedisBroker(url=_url))  # type: ignore[no-untyped-call]
    if STACK == "floor":
        from bench import floor

        dramatiq.get_broker().add_middleware(floor.middleware())


# BENCH_CONCURRENCY_KEY=1 (full stack only): the same actor with a concurrency
# key whose limit is never reached, for the cost of a key on a job that never waits.
_KEYED: dict[str, Any] = (
    {"concurrency_key": "bench:{sent_at}", "concurrency_limit": 100_000}
    if os.environ.get("BENCH_CONCURRENCY_KEY") == "1" and STACK == "django"
    else {}
)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, **_KEYED)
def noop(sent_at: float = 0.0) -> None:
    if sent_at:
        # Latency probe: when this job started, for the bench to compare.
        started = time.time()
        redis_broker().client.rpush(STARTED_KEY, json.dumps([sent_at, started]))


# CPU seconds of a ``work`` job, and seconds a ``hold`` job runs
# (BENCH_CONCURRENCY_KEY=mixed).
WORK_S = 0.001
HOLD_S = 0.01

# BENCH_CONCURRENCY_KEY=mixed: noop stays as it is, and this twin has the key,
# for blocks of each drained one after the other by the same workers.
if os.environ.get("BENCH_CONCURRENCY_KEY") == "mixed" and STACK == "django":

    @dramatiq.actor(
        queue_name=QUEUE,
        max_retries=0,
        concurrency_key="bench:{sent_at}",
        concurrency_limit=100_000,
    )
    def noop_keyed(sent_at: float = 0.0) -> None:
        pass

    # And a job that does some work, 1 ms of CPU in Python (as a template
    # rendered or a few queries' rows read would), without and with the same
    # key: what a key costs a job that is more than its own overhead. The
    # clock is read every 200 steps: read at each, its system call was most
    # of the millisecond.
    def _work(sent_at: float = 0.0) -> None:
        end = time.thread_time() + WORK_S
        while time.thread_time() < end:
            for _ in range(200):
                pass

    # A freed slot's wake-up (bench.queue_scenarios.slot_wakeup): jobs of one
    # key of limit 1, each reporting when it started and when it ended.
    @dramatiq.actor(
        queue_name=QUEUE,
        max_retries=0,
        concurrency_key="hold:{sent_at}",
        concurrency_limit=1,
    )
    def hold(sent_at: float = 0.0) -> None:
        started = time.time()
        time.sleep(HOLD_S)
        redis_broker().client.rpush(STARTED_KEY, json.dumps([started, time.time()]))

    work = dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="work")(_work)
    work_keyed = dramatiq.actor(
        queue_name=QUEUE,
        max_retries=0,
        actor_name="work_keyed",
        concurrency_key="bench:{sent_at}",
        concurrency_limit=100_000,
    )(_work)


# The fairness bench (bench.queue_scenarios.fairness): a tenant's job. The
# sender declares the fairness key (it is read when a job is sent); here each
# of tenant B's jobs reports when it was sent and when it started.
def _visit(tenant: str, sent_at: float = 0.0) -> None:
    # 5 ms of work (a query, a call): 8 threads run at most 1,600 a second, so
    # A's jobs, sent faster, wait in the queue as a big tenant's backlog does.
    time.sleep(0.005)
    if tenant == "B":
        redis_broker().client.rpush(STARTED_KEY, json.dumps([sent_at, time.time()]))


visit = dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="visit")(_visit)
visit_fair = dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="visit_fair")(_visit)
