"""Cache-aside with after-commit invalidation, against a real Redis and real threads."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone
from django_redis import get_redis_connection

from jobs.consistency import reachability
from jobs.consistency.cache import (
    bump_namespace,
    cache_loader,
    cache_stats,
    cached,
    invalidate_on_commit,
)
from jobs.consistency.outbox import relay_once
from jobs.middleware.dedup import Dedup
from jobs.models import OutboxMessage
from tests.conftest import IDLE_POLL_MS, join, queued_messages


def command_calls() -> dict[str, int]:
    stats = get_redis_connection("default").info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def calls_delta(before: dict[str, int], name: str) -> int:
    return command_calls().get(name, 0) - before.get(name, 0)


class CountingLoader:
    def __init__(self, value: object = "v", delay: float = 0.0) -> None:
        self.value = value
        self.delay = delay
        self.calls = 0
        self._mutex = threading.Lock()

    def __call__(self) -> object:
        with self._mutex:
            self.calls += 1
        time.sleep(self.delay)
        return self.value


def test_it_loads_on_a_miss_then_serves_hits_and_counts_them() -> None:
    loader = CountingLoader({"name": "ada"})

    first = cached("people", "1", loader)
    second = cached("people", "1", loader)

    assert first == second == {"name": "ada"}
    assert loader.calls == 1
    assert cache_stats()["people"] == {"hits": 1, "misses": 1}


def test_50_concurrent_misses_cause_one_load() -> None:
    loader = CountingLoader("expensive", delay=0.2)
    start = threading.Barrier(50)
    results: list[object] = []

    def read() -> None:
        start.wait()
        results.append(cached("reports", "2026-11", loader))

    threads = [threading.Thread(target=read) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == ["expensive"] * 50
    assert loader.calls == 1
    counted = cache_stats()["reports"]
    assert counted["hits"] + counted["misses"] == 50


@pytest.mark.django_db(transaction=True)
def test_a_version_bump_invalidates_the_whole_namespace_only() -> None:
    loader = CountingLoader()
    for key in ("a", "b", "c"):
        cached("catalog", key, loader)
    cached("other", "a", loader)
    assert loader.calls == 4

    bump_namespace("catalog")  # outside a transaction: at once
    for key in ("a", "b", "c"):
        cached("catalog", key, loader)
    cached("other", "a", loader)

    assert loader.calls == 7


@pytest.mark.django_db(transaction=True)
def test_invalidation_deletes_n_keys_in_one_round_trip_after_commit() -> None:
    keys = [str(n) for n in range(20)]
    loader = CountingLoader()
    for key in keys:
        cached("bulk", key, loader)

    before = command_calls()
    with transaction.atomic():
        invalidate_on_commit("bulk", *keys)
        assert calls_delta(before, "del") == 0  # nothing before the commit

    # One DEL for all 20 keys (and their leases), nothing else
    assert calls_delta(before, "del") == 1
    after = command_calls()
    others = {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if calls != before.get(name, 0) and name not in ("del", "info", "hincrby")
    }
    assert others == {}
    for key in keys:
        cached("bulk", key, loader)
    assert loader.calls == 40


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_drops_nothing() -> None:
    loader = CountingLoader()
    cached("kept", "1", loader)
    before = command_calls()

    with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012
        invalidate_on_commit("kept", "1")
        bump_namespace("kept")
        raise RuntimeError("rolled back")

    assert calls_delta(before, "del") == 0
    assert calls_delta(before, "incr") == 0
    cached("kept", "1", loader)
    assert loader.calls == 1


def naive_cached(key: str, loader: Callable[[], str]) -> str:
    """Textbook cache-aside without leases: the control that shows the race."""
    value = cache.get(key)
    if value is None:
        value = loader()
        cache.set(key, value, 300)
    return value  # type: ignore[no-any-return]


def run_readers_and_writers(*, use_toolkit: bool, seed: int, writes: int = 60) -> int:
    """Writers commit increasing values; readers check each read; returns stale reads."""
    user = User.objects.create_user(f"rw-{use_toolkit}", last_name="0")
    key = str(user.pk)
    committed = 0
    stale = 0
    done = threading.Event()
    rng = random.Random(seed)
    pauses = [rng.uniform(0, 0.004) for _ in range(1000)]

    def load() -> str:
        value = User.objects.get(pk=user.pk).last_name
        time.sleep(pauses[int(value) % len(pauses)])  # a slow loader widens the race
        return value

    def read() -> str:
        if use_toolkit:
            return cached("rw", key, load)
        return naive_cached(f"rw:{key}", load)

    def reader() -> None:
        nonlocal stale
        try:
            while not done.is_set():
                floor = committed
                if int(read()) < floor:
                    stale += 1
        finally:
            connection.close()

    def writer() -> None:
        nonlocal committed
        try:
            for value in range(1, writes + 1):
                with transaction.atomic():
                    User.objects.filter(pk=user.pk).update(last_name=str(value))
                    if use_toolkit:
                        invalidate_on_commit("rw", key)
                    else:
                        transaction.on_commit(lambda: cache.delete(f"rw:{key}"))
                committed = value  # after the block: committed and invalidated
                time.sleep(rng.uniform(0, 0.006))
        finally:
            done.set()
            connection.close()

    threads = [threading.Thread(target=reader) for _ in range(4)]
    threads.append(threading.Thread(target=writer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stale


@pytest.mark.django_db(transaction=True)
def test_after_each_committed_write_no_reader_gets_the_old_value() -> None:
    # Given readers racing a writer (fixed seed), the naive cache-aside serves stale values
    assert run_readers_and_writers(use_toolkit=False, seed=4) > 0
    # Then the leased cache-aside never does
    assert run_readers_and_writers(use_toolkit=True, seed=4) == 0


warm_loads: list[str] = []


@cache_loader("warm-test", ttl=60)
def load_for_warm_test(key: str) -> str:
    warm_loads.append(key)
    return f"warm:{key}"


@pytest.mark.django_db(transaction=True)
def test_warm_up_reloads_invalidated_keys_once(dedup_middleware: Dedup) -> None:
    warm_loads.clear()
    cached("warm-test", "k", lambda: "old")

    # Two invalidations in a row enqueue one warm-up job
    invalidate_on_commit("warm-test", "k", warm=True)
    invalidate_on_commit("warm-test", "k", warm=True)
    assert len(queued_messages("cache")) == 1

    worker = dramatiq.Worker(dramatiq.get_broker(), worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        join("cache")
    finally:
        worker.stop()
    assert warm_loads == ["k"]
    assert cached("warm-test", "k", lambda: "not used") == "warm:k"


@pytest.mark.django_db(transaction=True)
def test_an_invalidation_redis_could_not_take_is_done_once_it_answers(
    worker: dramatiq.Worker,
) -> None:
    # Given a cached value, and a process that just found Redis unreachable
    # (a request's timeout: the next callers skip Redis for a quiet spell)
    cached("profile-test", "7", lambda: "old")
    reachability.note_unreachable()

    # When a commit changes the row behind it
    with transaction.atomic():
        invalidate_on_commit("profile-test", "7")

    # Then, Redis answering again, the old value is dropped by a worker (before,
    # it was served until its TTL ran out) and the next read loads the new one
    reachability.reset()
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(minutes=1))
    assert relay_once() == 1
    join("cache")
    assert cached("profile-test", "7", lambda: "new") == "new"
