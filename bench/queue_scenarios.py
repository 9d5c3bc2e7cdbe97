"""Queue scenarios: worker throughput, idle latency and enqueue rate against raw Dramatiq.

Workers are real ``dramatiq`` processes (bench.worker_app) draining a queue
filled beforehand; throughput counts from the first acknowledged job to the
moment the queue is empty *and*, for the ledger variants, every job is recorded
as finished in the database (a ledger that lags behind is not free).

The ledger sits on SQLite in ``throughput`` and on PostgreSQL in
``throughput-pg``. PostgreSQL is a scenario of its own rather than more variants
of ``throughput``: ``--only throughput`` keeps its run time and its figures as
they were, and only ``throughput-pg`` starts a cluster (bench.postgres). It
drains raw Dramatiq again, interleaved with its own runs, so each ratio compares
two figures from the same minutes; a full run pays for that second baseline
(12 more drains of 20,000 jobs, a few minutes on 2 cores).
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import dramatiq
from django.conf import settings
from dramatiq.brokers.redis import RedisBroker

from bench import cpu, floor, procs
from bench.registry import Context, Row, Variants, measured, scenario
from jobs.broker import redis_broker
from jobs.broker.wakeup import WakeupRedisBroker
from jobs.concurrency import slots


@dataclass(frozen=True)
class Stack:
    label: str
    env: dict[str, str]
    done_sql: str | None = None  # counts finished jobs in the database
    setup_sql: str | None = None  # run on each fresh database before the drain
    stats: list[dict[str, Any]] = field(default_factory=list, compare=False)
    # Per worker process count, each drain's CPU per job by process kind (bench.cpu).
    cpu: dict[int, list[dict[str, float]]] = field(default_factory=dict, compare=False)
    # Options of each message the drain enqueues (procs.enqueue_pipelined
    # bypasses the broker's enqueue, which would write some of them itself).
    message_options: dict[str, Any] = field(default_factory=dict, compare=False)


LEDGER_DONE = "select count(*) from jobs_job where state = 'succeeded'"
ADMIN_DONE = "select count(*) from django_dramatiq_task where status = 'done'"

STACKS = {
    "raw": Stack("raw dramatiq", {"BENCH_STACK": "raw"}),
    # The least any durable job record costs (bench.floor): where 0.9x is possible.
    "floor": Stack("raw + minimal row", {"BENCH_STACK": "floor"}, floor.DONE, floor.CREATE),
    "ours": Stack("full stack", {"BENCH_STACK": "django"}, LEDGER_DONE),
    "ledger-off": Stack("ledger off", {"BENCH_STACK": "django", "JOBS_LEDGER_ENABLED": "0"}),
    "admin-mw": Stack(
        "django-dramatiq admin",
        {"BENCH_STACK": "django", "JOBS_LEDGER_ENABLED": "0", "BENCH_ADMIN_MIDDLEWARE": "1"},
        ADMIN_DONE,
    ),
    "wake-off": Stack("full, wake-up off", {"BENCH_STACK": "django", "JOBS_INSTANT_WAKEUP": "0"}),
}


def _stock_broker() -> WakeupRedisBroker:
    # instant_wakeup=False puts on the wire exactly what dramatiq's RedisBroker
    # does (for the pipelined fills and the stock workers' queues).
    return WakeupRedisBroker(url=settings.BROKER_REDIS_URL, instant_wakeup=False)


def _dramatiq_broker() -> dramatiq.Broker:
    """Dramatiq's own RedisBroker with its default middleware: the sender a
    raw Dramatiq user has. Not ``_stock_broker()``: our broker class also packs
    its enqueue command by hand (jobs.broker.packed), which is part of what the
    full stack is measured on, not of the baseline."""
    return RedisBroker(url=settings.BROKER_REDIS_URL)  # type: ignore[no-untyped-call]


# A fresh ledger database per drain: called with the drain's tag, it yields the
# DATABASE_URL for its workers and cleans up after them.
FreshDatabase = Callable[[str], AbstractContextManager[str]]


def _sqlite_copies(context: Context) -> FreshDatabase:
    """Copies of one migrated SQLite file (left in the work directory)."""
    template = procs.template_database(context.workdir)

    @contextmanager
    def fresh(tag: str) -> Iterator[str]:
        yield procs.copy_database(template, context.workdir / f"throughput-{tag}.sqlite3")

    return fresh


def _drain_rate(
    stack: Stack, *, n: int, processes: int, context: Context, databases: FreshDatabase, run: int
) -> float:
    broker = _stock_broker()
    broker.client.flushdb()
    tag = f"{stack.label}-{processes}-{run}".replace(" ", "_").replace(",", "")
    # Unique: middleware-cost drains the same "raw dramatiq" stack as throughput.
    stats_dir = Path(tempfile.mkdtemp(prefix=f"stats-{tag}-", dir=context.workdir))
    with databases(tag) as database_url:
        if stack.setup_sql:
            with _connect(database_url) as db:
                db.execute(stack.setup_sql)
                db.commit()
        env = procs.base_env(
            DATABASE_URL=database_url,
            BENCH_REDIS_URL=settings.BROKER_REDIS_URL,
            BENCH_STATS_DIR=str(stats_dir),
            **stack.env,
        )
        procs.enqueue_pipelined(
            broker, (procs.bench_message(options=stack.message_options) for _ in range(n))
        )
        msgs_key = f"{broker.namespace}:bench.msgs"
        first = end = None
        log = context.workdir / "w.log"
        with procs.workers(processes=processes, threads=8, env=env, log=log):
            deadline = time.monotonic() + 60 + n / 100
            while time.monotonic() < deadline:
                left = int(broker.client.hlen(msgs_key))
                now = time.perf_counter()
                if first is None and left < n:
                    first, start_left = now, left
                    cpu_before = cpu.snapshot()
                if left == 0:
                    end = now
                    break
                time.sleep(0.005)
            if end is None or first is None:
                raise RuntimeError(f"{stack.label}: queue not drained in time")
            if stack.done_sql:
                end = _wait_recorded(database_url, stack.done_sql, n, deadline)
            spent = cpu.per_job(cpu_before, cpu.snapshot(), start_left)
            stack.cpu.setdefault(processes, []).append(spent)
    stack.stats.extend(json.loads(p.read_text()) for p in stats_dir.glob("*.json"))
    # Jobs finished after the first one was seen, over the time they took.
    return start_left / (end - first)


def _wait_recorded(database_url: str, sql: str, n: int, deadline: float) -> float:
    with _connect(database_url) as db:
        while time.monotonic() < deadline:
            if db.execute(sql).fetchone()[0] >= n:
                return time.perf_counter()
            time.sleep(0.02)
    raise RuntimeError(f"the database never recorded {n} finished jobs")


def _connect(database_url: str) -> AbstractContextManager[Any]:
    """A connection that counts rows behind the workers' backs, closed on exit."""
    if database_url.startswith("sqlite:///"):
        return closing(sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=30))
    import psycopg  # the postgres extra; only PostgreSQL drains get here

    # Autocommit: each count sees every transaction committed before it.
    return psycopg.connect(database_url, autocommit=True)


def _ratio_row(
    candidate: str, value: float, baseline: str, base: float, target: float | None
) -> Row:
    ratio = value / base
    return Row(
        candidate,
        f"{value:,.0f} jobs/s",
        baseline,
        f"{base:,.0f} jobs/s",
        f"{ratio:.2f}x",
        f">= {target:.2f}x" if target else "-",
        target is None or ratio >= target,
    )


@measured("throughput", "no-op jobs drained by dramatiq worker processes (8 threads each)")
def throughput(context: Context) -> list[Row]:
    n = 1_000 if context.quick else 20_000
    databases = _sqlite_copies(context)
    names = ["raw", "ours", "floor", "ledger-off", "admin-mw", "wake-off"]
    stacks = {name: _fresh(STACKS[name]) for name in names}
    rows: list[Row] = []
    for processes in (1,) if context.quick else (1, 2):
        rates: dict[str, list[float]] = {name: [] for name in names}
        for run in range(context.runs):
            for name in names:  # interleaved, so drift hits every variant alike
                rates[name].append(
                    _drain_rate(
                        stacks[name],
                        n=n,
                        processes=processes,
                        context=context,
                        databases=databases,
                        run=run,
                    )
                )
        med = {name: statistics.median(values) for name, values in rates.items()}
        p = f"{processes}x8"
        rows += [
            _ratio_row(f"full stack {p}", med["ours"], "raw dramatiq", med["raw"], 0.9),
            _cpu_row(f"cpu per job {p}", stacks["ours"], stacks["raw"], processes),
            _ratio_row(f"minimal row {p}", med["floor"], "raw dramatiq", med["raw"], None),
            _cpu_row(f"cpu per job, minimal row {p}", stacks["floor"], stacks["raw"], processes),
            _ratio_row(f"ledger on {p}", med["ours"], "ledger off", med["ledger-off"], 0.8),
            _ratio_row(
                f"dj-dramatiq admin {p}", med["admin-mw"], "ledger off", med["ledger-off"], None
            ),
            # No target here: under load both run the same consumer code, and
            # drains spread far more than 2% (the next row); wakeup-load times
            # the paths that differ (bench.wakeup_load).
            _ratio_row(f"wake-up on {p}", med["ours"], "wake-up off", med["wake-off"], None),
            _spread_row(f"spread of drains {p}", rates["ours"], "wake-up off", rates["wake-off"]),
        ]
    jobs = n * context.runs * (1 if context.quick else 2)
    rows += [_db_cost_row(stacks[name], jobs) for name in ("ours", "admin-mw")]
    return rows


def _spread_row(label: str, values: list[float], baseline: str, base: list[float]) -> Row:
    """The slowest and fastest drain of two stacks: how far one run of the
    same code moves from the next."""

    def spread(rates: list[float]) -> str:
        return f"{min(rates):,.0f}-{max(rates):,.0f} jobs/s"

    return Row(label, spread(values), baseline, spread(base))


def _fresh(stack: Stack) -> Stack:
    """The stack without the figures of an earlier scenario."""
    return Stack(stack.label, stack.env, stack.done_sql, stack.setup_sql)


def _cpu_row(label: str, stack: Stack, baseline: Stack, processes: int) -> Row:
    """Median CPU per job by process kind, and raw's total over ours (no target:
    the throughput ratio is the target; this says where the difference goes)."""
    ours, raw = (
        cpu.medians(stack.cpu.get(processes, [])),
        cpu.medians(baseline.cpu.get(processes, [])),
    )
    ratio = f"{raw['total'] / ours['total']:.2f}x" if ours and raw and ours["total"] else "-"
    return Row(label, cpu.describe(ours), baseline.label, cpu.describe(raw), ratio)


def _db_cost_row(stack: Stack, jobs: int) -> Row:
    statements = sum(s["statements"] for s in stack.stats) / jobs
    writes = sum(s.get("ledger_writes", 0) for s in stack.stats)
    note = f"{statements:.2f} SQL/job" + (f", {jobs / writes:.0f} jobs/txn" if writes else "")
    return Row(f"db cost: {stack.label}", note)


@measured(
    "throughput-pg",
    "throughput's full stack 1x8 and 2x8 with the ledger on PostgreSQL (the bench's own"
    " cluster, a fresh database per drain) vs raw dramatiq, measured again in this scenario",
)
def throughput_pg(context: Context) -> list[Row]:
    from bench import postgres

    reason = postgres.missing()
    if reason:
        print(f"throughput-pg: PostgreSQL rows skipped: {reason}", file=sys.stderr, flush=True)
        return [Row("full stack (PostgreSQL)", f"skipped: {reason}")]
    n = 1_000 if context.quick else 20_000
    stacks = {
        "raw": _fresh(STACKS["raw"]),
        "ours": Stack("full stack on PostgreSQL", STACKS["ours"].env, LEDGER_DONE),
        "floor": _fresh(STACKS["floor"]),
    }
    rows: list[Row] = []
    with postgres.cluster(context.workdir) as cluster:
        for processes in (1,) if context.quick else (1, 2):
            rates: dict[str, list[float]] = {name: [] for name in stacks}
            for run in range(context.runs):
                for name, stack in stacks.items():  # interleaved, as in throughput
                    rate = _drain_rate(
                        stack,
                        n=n,
                        processes=processes,
                        context=context,
                        databases=cluster.fresh_database,
                        run=run,
                    )
                    rates[name].append(rate)
            raw, ours, least = (statistics.median(rates[name]) for name in ("raw", "ours", "floor"))
            p = f"{processes}x8 (PostgreSQL)"
            rows += [
                _ratio_row(f"full stack {p}", ours, "raw dramatiq", raw, 0.9),
                _cpu_row(f"cpu per job {p}", stacks["ours"], stacks["raw"], processes),
                _ratio_row(f"minimal row {p}", least, "raw dramatiq", raw, None),
                _cpu_row(
                    f"cpu per job, minimal row {p}", stacks["floor"], stacks["raw"], processes
                ),
            ]
    jobs = n * context.runs * (1 if context.quick else 2)
    return [*rows, _db_cost_row(stacks["ours"], jobs)]


def _latencies(
    producer: WakeupRedisBroker | dramatiq.Broker,
    env: dict[str, str],
    *,
    count: int,
    context: Context,
) -> list[float]:
    client = _stock_broker().client
    client.delete(procs.STARTED_KEY)
    send = _sender(producer)
    latencies = []
    with procs.workers(processes=1, threads=8, env=env, log=context.workdir / "w.log"):
        send(time.time())  # a first job shows the worker is up
        if _pop_started(client, timeout=30) is None:
            raise RuntimeError("the bench worker did not start within 30 s")
        time.sleep(1.0)  # idle: the stock consumer has backed off to its timeout
        for _ in range(count):
            # Random gaps meet the stock consumer at any point of its backoff.
            time.sleep(random.uniform(0.02, 0.3))
            send(time.time())
            popped = _pop_started(client, timeout=10)
            if popped is None:
                raise RuntimeError("latency probe job did not start within 10 s")
            sent_at, started = json.loads(popped[1])
            latencies.append((started - sent_at) * 1000)
    return latencies


def _pop_started(client: Any, *, timeout: float) -> Any:
    """The next start a probe job recorded (BLPOP's reply), None after
    ``timeout`` seconds. Short BLPOPs: the broker's client gives up reading
    after its socket timeout (JOBS_REDIS_SOCKET_TIMEOUT, under a second), and
    a FIFO queue keeps tenant B waiting for seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        popped = client.blpop([procs.STARTED_KEY], timeout=0.25)
        if popped is not None:
            return popped
    return None


def _sender(broker: dramatiq.Broker) -> Callable[[float], Any]:
    try:
        actor = broker.get_actor("noop")
    except dramatiq.errors.ActorNotFound:
        actor = dramatiq.actor(broker=broker, actor_name="noop", queue_name="bench")(_noop)
    return lambda sent_at: actor.send(sent_at) if sent_at else actor.send()


def _noop(sent_at: float = 0.0) -> None:
    """Producer-side stand-in for bench.worker_app.noop (only its name matters)."""


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


@measured("idle-latency", "enqueue -> actor start, one job at a time, idle 1x8 worker")
def idle_latency(context: Context) -> list[Row]:
    count = 15 if context.quick else 200
    url = settings.BROKER_REDIS_URL
    raw = procs.base_env(BENCH_STACK="raw", BENCH_REDIS_URL=url)
    variants = [
        ("raw, wake-up", WakeupRedisBroker(url=url), {**raw, "BENCH_BROKER": "wakeup"}),
        ("full stack, wake-up", dramatiq.get_broker(), procs.base_env(BENCH_STACK="django")),
        ("raw dramatiq", _dramatiq_broker(), raw),
    ]
    measured_ms = {
        label: _latencies(b, env, count=count, context=context) for label, b, env in variants
    }
    base = measured_ms["raw dramatiq"]
    base_text = f"p50 {_percentile(base, 0.5):.1f} / p99 {_percentile(base, 0.99):.1f} ms"
    rows = []
    for label, _, _ in variants[:2]:
        values = measured_ms[label]
        p50, p99 = _percentile(values, 0.5), _percentile(values, 0.99)
        rows.append(
            Row(
                label,
                f"p50 {p50:.1f} / p99 {p99:.1f} ms",
                "raw dramatiq",
                base_text,
                f"{_percentile(base, 0.5) / p50:.0f}x faster",
                "p50 <= 2.5, p99 <= 5 ms",
                p50 <= 2.5 and p99 <= 5,
            )
        )
    return rows


@scenario(
    "enqueue",
    "actor.send(): full stack (wake-up token, ledger event) vs raw dramatiq RedisBroker",
    n=5_000,
    quick_n=500,
    target=0.9,
)
def enqueue_single() -> Variants:
    ours = _sender(dramatiq.get_broker())
    raw = _sender(_dramatiq_broker())

    def candidate(n: int) -> None:
        for _ in range(n):
            ours(0.0)

    def baseline(n: int) -> None:
        for _ in range(n):
            raw(0.0)

    return Variants(candidate, baseline, "full stack", "raw dramatiq", teardown=_flush_broker)


@measured(
    "intake-drain",
    "first sends' ledger rows: drained from the Redis intake vs built and written by the sender",
)
def intake_drain(context: Context) -> list[Row]:
    """What the intake moved off ``send()`` costs where it went.

    Both sides write the same rows into an empty ledger: the drainer reads
    the intake and the messages back from Redis; the baseline builds the events
    in process, as the sender's Ledger middleware did before the intake.
    """
    from jobs.ledger import intake
    from jobs.ledger import writer as ledger
    from jobs.middleware.ledger import enqueue_event
    from jobs.models import Job

    n = 500 if context.quick else 5_000
    broker = dramatiq.get_broker()
    send = _sender(broker)
    drained: list[float] = []
    built: list[float] = []
    for _ in range(context.runs):
        _flush_broker()
        Job.objects.all().delete()
        for _ in range(n):
            send(0.0)
        started = time.perf_counter()
        intake.drain(broker)
        drained.append(n / (time.perf_counter() - started))
        messages = [
            dramatiq.Message.decode(data)
            for data in broker.client.hvals(f"{broker.namespace}:bench.msgs")  # type: ignore[attr-defined]
        ]
        Job.objects.all().delete()
        started = time.perf_counter()
        ledger.write_now([enqueue_event(broker, m, delayed=False) for m in messages])
        built.append(n / (time.perf_counter() - started))
    _flush_broker()
    Job.objects.all().delete()
    drain_rate, build_rate = statistics.median(drained), statistics.median(built)
    return [
        Row(
            "intake drain",
            f"{drain_rate:,.0f} rows/s",
            "built by the sender",
            f"{build_rate:,.0f} rows/s",
            f"{drain_rate / build_rate:.2f}x",
        )
    ]


@scenario(
    "enqueue-bulk",
    "pipelined enqueue, 500 messages per round trip: with wake-up tokens vs stock dispatch",
    n=20_000,
    quick_n=2_000,
    target=0.8,
)
def enqueue_bulk() -> Variants:
    wake = WakeupRedisBroker(url=settings.BROKER_REDIS_URL)
    stock = _stock_broker()

    def candidate(n: int) -> None:
        procs.enqueue_pipelined(wake, (procs.bench_message() for _ in range(n)))

    def baseline(n: int) -> None:
        procs.enqueue_pipelined(stock, (procs.bench_message() for _ in range(n)))

    return Variants(candidate, baseline, "wake-up broker", "stock dispatch", teardown=_flush_broker)


def _flush_broker() -> None:
    from jobs.ledger import writer as ledger

    # Not the intake: its entries go with the flush (the workers' drain is not
    # the sender's cost; its own rate is the intake-drain scenario's).
    ledger.flush(intake=False)
    redis_broker().client.flushdb()


@measured(
    "middleware-cost",
    "time each middleware's per-message hooks and the ledger writer take per job (full stack 1x8)",
)
def middleware_cost(context: Context) -> list[Row]:
    n = 1_000 if context.quick else 20_000
    databases = _sqlite_copies(context)
    timed = Stack("hook times", {**STACKS["ours"].env, "BENCH_HOOK_TIMES": "1"}, LEDGER_DONE)
    raw = Stack(STACKS["raw"].label, STACKS["raw"].env)
    rates: dict[str, list[float]] = {"timed": [], "raw": []}
    for run in range(context.runs):
        for name, stack in (("timed", timed), ("raw", raw)):
            rate = _drain_rate(
                stack, n=n, processes=1, context=context, databases=databases, run=run
            )
            rates[name].append(rate)
    jobs = n * context.runs
    spent: dict[str, float] = {}
    for stats in timed.stats:
        for name, seconds in stats.get("hook_seconds", {}).items():
            spent[name] = spent.get(name, 0.0) + seconds
        # Elapsed time inside the writer's batch writes (stats.write_seconds),
        # GIL waits included: an upper bound on the writer's own CPU.
        writer = "ledger writer (elapsed in writes)"
        spent[writer] = spent.get(writer, 0.0) + stats.get("ledger_write_seconds", 0.0)
    raw_us = 1e6 / statistics.median(rates["raw"])
    timed_us = 1e6 / statistics.median(rates["timed"])
    rows = [
        Row("wall time per job: full stack (timed)", f"{timed_us:.0f} us"),
        Row("wall time per job: raw dramatiq", f"{raw_us:.0f} us"),
    ]
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        # Thread time summed over 8 worker threads: comparable between
        # middleware, not to the wall time per job above.
        rows.append(Row(f"hooks of {name}", f"{seconds / jobs * 1e6:.0f} us/job (thread time)"))
    return rows


@measured(
    "concurrency-key",
    "a concurrency key whose limit is never reached, against the same actor without one "
    "(full stack, 1x8 and 2x8)",
)
def concurrency_key(context: Context) -> list[Row]:
    n = 1_000 if context.quick else 20_000
    databases = _sqlite_copies(context)
    plain = _fresh(STACKS["ours"])
    keyed = Stack(
        "keyed",
        {**STACKS["ours"].env, "BENCH_CONCURRENCY_KEY": "1"},
        LEDGER_DONE,
        # The key a sender writes into each message (WakeupRedisBroker.enqueue),
        # for the fetch to take its slot: bench.worker_app's template with
        # noop's default argument.
        message_options={slots.SEND_OPTION: "bench:0.0"},
    )
    rows: list[Row] = []
    counts = (1,) if context.quick else (1, 2)
    for processes in counts:
        rates: dict[str, list[float]] = {"plain": [], "keyed": []}
        for run in range(context.runs):
            for name, stack in (("plain", plain), ("keyed", keyed)):  # interleaved
                rates[name].append(
                    _drain_rate(
                        stack,
                        n=n,
                        processes=processes,
                        context=context,
                        databases=databases,
                        run=run,
                    )
                )
        rows.append(
            _ratio_row(
                f"with a key {processes}x8",
                statistics.median(rates["keyed"]),
                "without",
                statistics.median(rates["plain"]),
                0.95,
            )
        )
        # Each run's pair, drained one after the other: on two shared cores the
        # spread says how far any one ratio can be trusted.
        pairs = zip(rates["keyed"], rates["plain"], strict=True)
        rows.append(
            Row(f"run by run, key {processes}x8", " ".join(f"{k / p:.2f}x" for k, p in pairs))
        )
        # Where a key's cost goes: the worker's Python or Redis's Lua.
        rows.append(_cpu_row(f"CPU per job, key {processes}x8", keyed, plain, processes))
        # One key for every job (the scenario's target), and a key per job, as
        # "order:{order_id}" gives: each job's slot a new hash in Redis.
        # And the control: the same drain with no key in any block, which
        # says how far the measure itself is from 1.00x on the day.
        # And, at two processes (one in a quick run), jobs of 1 ms of CPU:
        # the key's cost against a job that does some work.
        kinds: tuple[str, ...] = ("key", "a key per job", "control")
        if processes == counts[-1]:
            kinds += (f"key, {WORK}", f"control, {WORK}")
        for kind in kinds:
            ratios = [
                ratio
                for _ in range(context.runs)
                for ratio in _alternating_ratios(context, databases, processes, kind=kind)
            ]
            median = statistics.median(ratios)
            target = kind in ("key", f"key, {WORK}")
            rows.append(
                Row(
                    f"alternating blocks, {kind.replace('control', 'no key (control)')}"
                    f" {processes}x8",
                    f"{len(ratios)} pairs, {min(ratios):.2f}-{max(ratios):.2f}x",
                    "without, same drain",
                    "-",
                    f"{median:.2f}x",
                    ">= 0.95x" if target else "-",
                    not target or median >= 0.95,
                )
            )
    return rows


# Jobs per block and blocks per drain of the alternating measurement: a block
# drains in about half a second at one process, long against a boundary's
# blur (8 threads, the prefetch) and short against the machine's drift.
BLOCK, BLOCKS = 2_000, 21
# Alternating drains whose kind ends with this drain jobs of 1 ms of work
# (bench.worker_app's ``work``): at about a third of the no-op's rate at two
# processes, in blocks of half the size, each still about half a second.
WORK = "jobs of 1 ms"


def _alternating_ratios(
    context: Context, databases: FreshDatabase, processes: int, *, kind: str = "key"
) -> list[float]:
    """Blocks of jobs (no-ops, or 1 ms of work) without and with a key,
    alternating in one queue that the same workers drain: each keyed block's
    rate over the mean rate of the plain blocks either side. Whole drains moved
    by a fifth from one to the next on this project's two shared cores;
    neighbouring blocks, half a second apart, share more of the machine's speed.
    A block's rate is taken over the middle 80 % of its jobs' ends (the ledger's
    ``finished_at``), which leaves out the blur where two blocks meet. The plain
    jobs share a queue with a keyed actor here, so the fetch looks at their
    payloads too (a string search, under a microsecond of Redis). ``kind``:
    "key", one key for all keyed jobs; "a key per job", each its own
    (``bench:<n>``), as an order id gives; "control", no key in any block (every
    block plain ``noop``), for the measure's own distance from 1.00x. Either of
    "key" and "control" followed by ``WORK`` ("key, jobs of 1 ms") drains jobs
    of 1 ms of CPU (``work`` and ``work_keyed``) rather than no-ops."""
    size, blocks = (250, 7) if context.quick else (BLOCK, BLOCKS)
    plain_actor, keyed_actor = "noop", "noop_keyed"
    if kind.endswith(WORK):
        size //= 2
        plain_actor, keyed_actor = "work", "work_keyed"
    broker = _stock_broker()
    broker.client.flushdb()
    block_of: dict[str, int] = {}

    def messages() -> Iterator[dramatiq.Message[Any]]:
        for block in range(blocks):
            keyed = block % 2 == 1 and not kind.startswith("control")
            for _ in range(size):
                message = procs.bench_message(
                    actor_name=keyed_actor if keyed else plain_actor,
                    options={slots.SEND_OPTION: _bench_key(kind, len(block_of))} if keyed else {},
                )
                block_of[message.message_id] = block
                yield message

    stats_dir = Path(tempfile.mkdtemp(prefix="stats-alternating-", dir=context.workdir))
    with databases(f"alternating-{processes}") as database_url:
        env = procs.base_env(
            DATABASE_URL=database_url,
            BENCH_REDIS_URL=settings.BROKER_REDIS_URL,
            BENCH_STATS_DIR=str(stats_dir),
            **{**STACKS["ours"].env, "BENCH_CONCURRENCY_KEY": "mixed"},
        )
        procs.enqueue_pipelined(broker, messages())
        n = size * blocks
        with procs.workers(processes=processes, threads=8, env=env, log=context.workdir / "w.log"):
            _wait_recorded(database_url, LEDGER_DONE, n, time.monotonic() + 60 + n / 100)
        with _connect(database_url) as db:
            ended = db.execute("select message_id, finished_at from jobs_job").fetchall()
    ends: dict[int, list[float]] = {}
    for message_id, finished_at in ended:
        stamp = datetime.fromisoformat(str(finished_at)).timestamp()
        ends.setdefault(block_of[message_id], []).append(stamp)
    rates = []
    for block in range(blocks):
        times = sorted(ends[block])
        low, high = times[len(times) // 10], times[len(times) * 9 // 10]
        rates.append((len(times) * 0.8) / max(high - low, 1e-6))
    # Each keyed block against the mean of the plain blocks either side, so a
    # drift through the drain (a growing table) favours neither; from the
    # second keyed block on, the first drains while the workers warm up.
    return [rates[b] / ((rates[b - 1] + rates[b + 1]) / 2) for b in range(3, blocks - 1, 2)]


@measured(
    "slot-wakeup",
    "a job's end to the next waiting job's start on a key of limit 1: jobs of 10 ms, "
    "all sent before the worker starts (full stack, 1x8)",
)
def slot_wakeup(context: Context) -> list[Row]:
    n = 30 if context.quick else 300
    databases = _sqlite_copies(context)
    broker = _stock_broker()
    gaps: list[float] = []
    for run in range(context.runs):
        broker.client.flushdb()
        with databases(f"slot-wakeup-{run}") as database_url:
            env = procs.base_env(
                DATABASE_URL=database_url,
                BENCH_REDIS_URL=settings.BROKER_REDIS_URL,
                **{**STACKS["ours"].env, "BENCH_CONCURRENCY_KEY": "mixed"},
            )
            # All waiting before the worker starts: its first fetches take the
            # one slot and set the others aside (at most PARK_PER_FETCH a
            # fetch), and from then on each job starts when the one before it
            # frees the slot. The key hold's template gives ("hold:{sent_at}").
            key = {slots.SEND_OPTION: "hold:0.0"}
            procs.enqueue_pipelined(
                broker, (procs.bench_message(actor_name="hold", options=key) for _ in range(n))
            )
            runs: list[list[float]] = []
            with procs.workers(
                processes=1, threads=8, env=env, log=context.workdir / "w.log"
            ) as worker:
                # A run is 10 ms a job plus the hand-overs: far less than this,
                # unless hand-overs wait for the once-a-second sweep.
                deadline = time.monotonic() + 60 + n * 0.1
                while len(runs) < n:
                    left = deadline - time.monotonic()
                    if left <= 0 or worker.poll() is not None:
                        raise RuntimeError(
                            f"{len(runs)} of {n} jobs of one key ran in time"
                            f" (worker exit code {worker.poll()})"
                        )
                    popped = _pop_started(broker.client, timeout=min(left, 1.0))
                    if popped is not None:
                        runs.append(json.loads(popped[1]))
        runs.sort()
        gaps += [(nxt[0] - prev[1]) * 1000 for prev, nxt in itertools.pairwise(runs)]
    if min(gaps) < 0:
        # Two jobs of the key overlapped: the limit, not the latency, is wrong.
        raise RuntimeError(f"jobs of a key of limit 1 overlapped by {-min(gaps):.1f} ms")
    return [
        Row(
            f"a job's end to the next one's start ({len(gaps)} hand-overs)",
            f"p50 {_percentile(gaps, 0.5):.1f} ms, p99 {_percentile(gaps, 0.99):.1f} ms",
            "min, max",
            f"{min(gaps):.1f}, {max(gaps):.1f} ms",
        )
    ]


def _bench_key(kind: str, n: int) -> str:
    return f"bench:{n}" if kind == "a key per job" else "bench:0.0"


def _tenant_senders(broker: dramatiq.Broker) -> dict[str, dramatiq.Actor[Any, Any]]:
    """Producer-side twins of bench.worker_app's visit actors: the fair one
    declares the fairness key, which the sender reads."""
    senders = {}
    declared: dict[str, dict[str, Any]] = {
        "visit": {},
        "visit_fair": {"fairness_key": "tenant:{tenant}"},
    }
    for name, options in declared.items():
        try:
            senders[name] = broker.get_actor(name)
        except dramatiq.errors.ActorNotFound:
            senders[name] = dramatiq.actor(
                broker=broker, actor_name=name, queue_name=procs.QUEUE, **options
            )(_visit)
    return senders


def _visit(tenant: str, sent_at: float = 0.0) -> None:
    """Producer-side stand-in for bench.worker_app's visit (only its name matters)."""


def _b_waits(
    actor: dramatiq.Actor[Any, Any], *, big: int, small: int, context: Context, tag: str
) -> list[float]:
    """Tenant A sends ``big`` jobs, then tenant B ``small``, to a running 1x8
    full-stack worker: each of B's jobs' wait from its send to its start (ms)."""
    client = _stock_broker().client
    client.flushdb()
    databases = _sqlite_copies(context)
    with databases(f"fairness-{tag}") as database_url:
        env = procs.base_env(DATABASE_URL=database_url, **STACKS["ours"].env)
        with procs.workers(processes=1, threads=8, env=env, log=context.workdir / "w.log"):
            actor.send("B", time.time())  # a first job shows the worker is up
            if _pop_started(client, timeout=60) is None:
                raise RuntimeError("the bench worker did not start within 60 s")
            for _ in range(big):
                actor.send("A")
            for _ in range(small):
                actor.send("B", time.time())
            waits = []
            for _ in range(small):
                popped = _pop_started(client, timeout=120)
                if popped is None:
                    raise RuntimeError("tenant B's jobs did not all start within 120 s")
                sent_at, started = json.loads(popped[1])
                waits.append((started - sent_at) * 1000)
    return waits


@measured(
    "fairness",
    "tenant A sends 10,000 jobs of 5 ms, then tenant B 100: B's wait from send to start, "
    "fair queue against FIFO (full stack, 1x8)",
)
def fairness(context: Context) -> list[Row]:
    big, small = (2_000, 50) if context.quick else (10_000, 100)
    senders = _tenant_senders(dramatiq.get_broker())
    p95: dict[str, list[float]] = {"visit": [], "visit_fair": []}
    for run in range(context.runs):
        for name in p95:  # interleaved
            waits = _b_waits(
                senders[name], big=big, small=small, context=context, tag=f"{name}-{run}"
            )
            p95[name].append(_percentile(waits, 0.95))
    fair, fifo = statistics.median(p95["visit_fair"]), statistics.median(p95["visit"])
    return [
        Row(
            f"fair, B's p95 wait ({big:,} of A's first)",
            f"{fair:,.0f} ms",
            "FIFO",
            f"{fifo:,.0f} ms",
            f"{fifo / max(fair, 0.001):,.0f}x shorter",
            "shorter than FIFO",
            fair < fifo,
        )
    ]
