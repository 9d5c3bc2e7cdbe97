"""Per-key concurrency seen from outside, as an operator would: two real
``rundramatiq`` process groups of 8 threads each run jobs of a few keys with a
limit of 1 (whose jobs also take turns by a fairness key) and one key with a
limit of 3. Every run writes its start and its
end to the database; from those intervals the test computes how many runs of
each key overlapped, and checks it against the limit (reached, not just
respected). Then the same under SIGKILL: one worker's whole process group is
killed 3 times at a random moment while it runs jobs, and restarted. Every job
still runs, no key ever goes past its limit, and once the system has drained no
slot, parked list or fair key list is left in Redis.

Figures are printed (run with -s); the kill soak reports a fault-matrix row.

Run: bin/test tests/e2e/test_concurrency_soak.py -s   (also with --postgres)
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from jobs.broker import redis_broker
from jobs.concurrency import slots
from jobs.ledger import intake
from jobs.models import EffectRecord, Job
from tests.e2e.conftest import WorkerProcess
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
QUEUE = "soak-concurrency"
# A killed worker is judged dead 2 s after its last heartbeat, not the shipped
# 15 s (the same setting the other kill -9 tests shorten, read by the workers'
# broker as ``heartbeat_timeout``): its jobs are redelivered and its slots freed
# by the same verdict, so a kill costs the soak seconds, not a quarter minute.
ENV = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}
THREADS = 8
KILLS = 3
LIMITS = {
    "soak-order:1": 1,
    "soak-order:2": 1,
    "soak-order:3": 1,
    "soak-order:4": 1,
    "soak-tenant:big": 3,
}
# Rows of this test in jobs.EffectRecord (one per run): nothing else writes
# keys with this prefix, and job_id stays empty so the watchdog never reads them.
ROW_PREFIX = "concurrency-soak|"

# The actors, written into a module the worker subprocesses load as an
# installed app's ``tasks`` (rundramatiq's discovery) and executed here too, so
# this process sends with the same declarations. A run is one EffectRecord row:
# ``created_at`` its start, ``done_at`` its end (empty for a run killed midway),
# ``holder`` the process group and pid that ran it, ``claim_token`` its
# message id. The start is taken after the consumer took the slot, the end
# before the slot is freed: each recorded interval lies within a slot's tenure.
ACTORS = """
import os
import time
import uuid

import dramatiq
from django.utils import timezone

from jobs.models import EffectRecord

QUEUE = "soak-concurrency"


def _run(key: str, ms: int) -> None:
    message = dramatiq.middleware.CurrentMessage.get_current_message()
    row = EffectRecord.objects.create(
        key=f"concurrency-soak|{key}|{uuid.uuid4().hex}",
        claim_token=uuid.UUID(message.message_id).hex,
        holder=f"{os.getpgid(0)}:{os.getpid()}",
        lease_until=timezone.now(),
    )
    time.sleep(ms / 1000)
    EffectRecord.objects.filter(pk=row.pk).update(
        state=EffectRecord.State.DONE, done_at=timezone.now()
    )


@dramatiq.actor(
    queue_name=QUEUE,
    max_retries=0,
    concurrency_key="soak-order:{order_id}",
    concurrency_limit=1,
    fairness_key="soak-fair:{order_id}",
)
def soak_order(order_id: int, ms: int) -> None:
    _run(f"soak-order:{order_id}", ms)


@dramatiq.actor(
    queue_name=QUEUE, max_retries=0, concurrency_key="soak-tenant:{tenant}", concurrency_limit=3
)
def soak_tenant(tenant: str, ms: int) -> None:
    _run(f"soak-tenant:{tenant}", ms)
"""


@dataclass(frozen=True)
class Run:
    key: str
    message_id: str
    group: int  # the rundramatiq process group (its leader's pid)
    start: datetime
    end: datetime | None  # None: killed midway


def runs() -> list[Run]:
    found = []
    for key, token, holder, start, end in EffectRecord.objects.filter(
        key__startswith=ROW_PREFIX
    ).values_list("key", "claim_token", "holder", "created_at", "done_at"):
        found.append(Run(key.split("|")[1], token, int(holder.split(":")[0]), start, end))
    return found


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The largest number of intervals that overlapped in time (an end and a
    start at the same instant do not overlap)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def overlap_per_key(found: list[Run], killed_at: dict[int, datetime]) -> dict[str, int]:
    """Most runs of each key at once; a killed run lasts until its group's kill."""
    intervals: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for run in found:
        end = run.end if run.end is not None else killed_at[run.group]
        intervals[run.key].append((run.start, max(end, run.start)))
    return {key: most_at_once(intervals[key]) for key in LIMITS}


def leftovers() -> dict[str, Any]:
    """Every slot and parked job still in Redis, by key."""
    client = redis_broker().client
    namespace = redis_broker().namespace
    left: dict[str, Any] = {}
    for pattern in (slots.SLOTS, slots.PARKED):
        for raw in client.keys(f"{namespace}:{pattern}*"):
            name = raw.decode() if isinstance(raw, bytes) else raw
            key = name.split(pattern, 1)[1]
            left[name] = (
                slots.holders(client, namespace, key)
                if pattern == slots.SLOTS
                else f"{len(slots.parked(client, namespace, key))} parked"
            )
    for name in (slots.PARKED_KEYS, slots.LIMITS):
        if client.exists(f"{namespace}:{name}"):
            left[f"{namespace}:{name}"] = client.type(f"{namespace}:{name}")
    # The orders' fair key lists, turns and counts (jobs.concurrency.fairness).
    for raw in client.keys(f"{namespace}:{QUEUE}:fair*"):
        left[raw.decode() if isinstance(raw, bytes) else raw] = client.type(raw)
    return left


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held; AssertionError after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


_declared: dict[str, Any] = {}


@pytest.fixture
def actors(tmp_path: Path, worker_env: dict[str, str]) -> dict[str, Any]:
    """The soak's actors, here and in the workers' settings (an app in tmp_path)."""
    app = tmp_path / "soak_app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(ACTORS)
    (tmp_path / "soak_settings.py").write_text(
        "from tests.worker_settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'soak_app']  # noqa: F405\n"
    )
    worker_env["DJANGO_SETTINGS_MODULE"] = "soak_settings"
    worker_env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), *filter(None, [worker_env.get("PYTHONPATH")])]
    )
    if not _declared:  # once per session: an actor name is declared once per broker
        _declared["__name__"] = "soak_app.tasks"
        exec(compile(ACTORS, "soak_app/tasks.py", "exec"), _declared)
    return _declared


def send_all(
    actors: dict[str, Any],
    rng: random.Random,
    per_order: int,
    tenant_jobs: int,
    ms: tuple[int, int],
) -> list[str]:
    jobs: list[tuple[Any, tuple[Any, ...]]] = [
        (actors["soak_order"], (n, rng.randint(*ms))) for n in range(1, 5) for _ in range(per_order)
    ]
    jobs += [(actors["soak_tenant"], ("big", rng.randint(*ms))) for _ in range(tenant_jobs)]
    rng.shuffle(jobs)
    return [actor.send(*args).message_id for actor, args in jobs]


def start_pair(start_worker: Callable[..., WorkerProcess]) -> list[WorkerProcess]:
    workers = [start_worker(env=ENV, threads=THREADS, queues=(QUEUE,)) for _ in range(2)]
    for worker in workers:
        worker.wait_for_log(READY)
    return workers


def finished(ids: list[str]) -> set[str]:
    wanted = {i.replace("-", "") for i in ids}
    return {r.message_id for r in runs() if r.end is not None} & wanted


def ledger_not_succeeded(ids: list[str]) -> int:
    intake.catch_up(timeout=1)
    return len(ids) - Job.objects.filter(message_id__in=ids, state="succeeded").count()


@pytest.mark.one_row("sqlite", "slots live in Redis; the kill soak runs in the other row")
def test_no_key_runs_past_its_limit_and_each_reaches_it(
    start_worker: Callable[..., WorkerProcess], actors: dict[str, Any]
) -> None:
    began = time.monotonic()
    start_pair(start_worker)
    rng = random.Random(7)
    sent = time.monotonic()
    ids = send_all(actors, rng, per_order=8, tenant_jobs=30, ms=(60, 200))
    wait_until(lambda: len(finished(ids)) == len(ids), 30, "every job to run")
    drained = time.monotonic() - sent
    freed = wait_until(lambda: not leftovers(), 10, "slots to be freed")
    found = runs()
    overlap = overlap_per_key(found, {})
    parks, waits = idle_keys_probed(actors, [f"soak-order:{n}" for n in range(11, 16)])
    print(
        f"\nconcurrency, 2 x {THREADS} threads, no fault: {len(ids)} jobs drained in "
        f"{drained:.1f} s (slots and parked lists gone {freed:.1f} s later)\n"
        f"  most at once per key: {overlap} (limits {LIMITS})\n"
        f"  a job of an idle key: parked {parks} time(s), started "
        f"{', '.join(f'{w * 1000:.0f}' for w in waits)} ms after its send\n"
        f"  total {time.monotonic() - began:.1f} s"
    )
    assert overlap == LIMITS, "each key reaches its limit and never goes past it"
    assert len(found) == len(ids), "each job ran once"
    assert all(r.end is not None for r in found)
    # A job whose key has a free slot takes it with its fetch: parked, it would
    # wait for a release or for the next sweep (up to a second) instead.
    assert parks == 0, "a job of a key with free slots is never parked"


def idle_keys_probed(actors: dict[str, Any], keys: list[str]) -> tuple[int, list[float]]:
    """One job per idle key, one after the other: how many times a job was
    pushed onto a parked list (Redis keyspace events), and each one's seconds
    from its send to its start."""
    client = redis_broker().client
    namespace = redis_broker().namespace
    db = client.connection_pool.connection_kwargs.get("db", 0)
    client.config_set("notify-keyspace-events", "Kl")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(f"__keyspace@{db}__:{namespace}:{slots.PARKED}*")
    waits = []
    try:
        for key in keys:
            asked = timezone.now()
            message_id = actors["soak_order"].send(int(key.split(":")[1]), 10).message_id
            wait_until(partial(finished, [message_id]), 10, f"the job of {key} to run")
            (start,) = [r.start for r in runs() if r.message_id == message_id.replace("-", "")]
            waits.append((start - asked).total_seconds())
        parks, quiet_from = 0, time.monotonic()
        while time.monotonic() - quiet_from < 0.3:  # every event out, then 0.3 s of none
            event = pubsub.get_message(timeout=0.1)
            if event is not None:
                data = event["data"]
                parks += (data.decode() if isinstance(data, bytes) else data) == "rpush"
                quiet_from = time.monotonic()
    finally:
        pubsub.close()
        client.config_set("notify-keyspace-events", "")
    return parks, waits


@pytest.mark.one_row("postgresql", "slots live in Redis; one soak is enough")
def test_kill_9_soak_keeps_every_limit_loses_nothing_and_leaks_no_slot(
    start_worker: Callable[..., WorkerProcess], actors: dict[str, Any]
) -> None:
    began = time.monotonic()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    survivor, victim = start_pair(start_worker)
    sent = time.monotonic()
    ids = send_all(actors, rng, per_order=40, tenant_jobs=90, ms=(50, 250))
    killed_at: dict[int, datetime] = {}
    in_flight: list[str] = []  # per kill, the keys of the runs it cut short
    for _ in range(KILLS):
        group = victim.process.pid

        def victim_runs_a_job(group: int = group) -> bool:
            return any(r.end is None and r.group == group for r in runs())

        # (Killed all the same if it runs none: the jobs stuck, which the
        # checks below then tell precisely.)
        with contextlib.suppress(AssertionError):
            wait_until(victim_runs_a_job, 10, "the victim to run a job")
        time.sleep(rng.uniform(0, 0.5))  # a random moment of its work
        victim.kill()  # SIGKILL to the whole process group, then reaped
        # Taken once the group is gone: no run of it can end later than this.
        killed_at[group] = timezone.now()
        cut = Counter(r.key for r in runs() if r.end is None and r.group == group)
        in_flight.append(",".join(f"{k}x{n}" for k, n in sorted(cut.items())) or "none")
        victim = start_worker(env=ENV, threads=THREADS, queues=(QUEUE,))
        victim.wait_for_log(READY)
    drained: float | None = None
    freed: float | None = None
    with contextlib.suppress(AssertionError):
        wait_until(lambda: len(finished(ids)) == len(ids), 40, "every job to run")
        drained = time.monotonic() - sent
        # A dead worker's slot goes with the verdict on it (heartbeat timeout,
        # then the next sweep or acquire): well within this.
        freed = wait_until(lambda: not leftovers(), 10, "slots to be freed")
    left = leftovers()
    found = runs()
    wrong = ledger_not_succeeded(ids)
    alive = {survivor.process.pid, victim.process.pid}
    unfinished_alive = [r for r in found if r.end is None and r.group in alive]
    # Finished runs, and runs cut short by a kill (lasting until it); a run of a
    # live worker that never ended (none once drained) has no end to count.
    counted = [r for r in found if r.end is not None or r.group in killed_at]
    overlap = overlap_per_key(counted, killed_at)
    lost = len(ids) - len(finished(ids))
    twice = sum(n - 1 for n in Counter(r.message_id for r in found).values())
    above = {k: overlap[k] - limit for k, limit in LIMITS.items() if overlap[k] > limit}
    print(
        f"\nconcurrency kill -9 soak (seed {seed}): {len(ids)} jobs on 2 x {THREADS} threads, "
        f"{KILLS} kills of one group (runs cut short per kill: {'; '.join(in_flight)})\n"
        f"  drained: {'NOT' if drained is None else f'{drained:.1f} s'} after the first send; "
        f"slots and parked lists gone {'NOT' if freed is None else f'{freed:.1f} s'} later; "
        f"leftovers: {left or 'none'}\n"
        f"  runs {len(found)}, {twice} of them again after a kill; lost {lost}; "
        f"unended runs of live workers {len(unfinished_alive)}; "
        f"ledger rows not succeeded {wrong}\n"
        f"  most at once per key: {overlap} (limits {LIMITS})\n"
        f"  total {time.monotonic() - began:.1f} s"
    )
    report(
        FaultRow(
            f"worker group SIGKILLed {KILLS}x under per-key concurrency limits",
            len(ids),
            lost,
            twice,
            wrong,
            drained,
            note=f"runs past a key's limit: {above or 'none'}; slot/parked keys left: {len(left)}",
        )
    )
    assert lost == 0, "every job ran to its end at least once"
    assert not unfinished_alive, f"runs of live workers never ended: {unfinished_alive}"
    assert not above, f"more runs at once than the limit: {overlap}"
    assert not left, f"slots or parked jobs left after the drain: {left}"
    assert wrong == 0, "every job ends succeeded in the ledger"
