"""Edge cases of redis_lock found by review: forks, threads sharing a holding, late fences.

Each failed on the first version of lazy fencing tokens and batched lock metrics.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django_redis import get_redis_connection

from jobs.consistency.locks import LockLost, fenced_set, redis_lock, stats
from jobs.observability import metrics


def test_a_holder_that_lost_its_lock_before_asking_gets_no_token_and_writes_nothing() -> None:
    client = get_redis_connection("default")
    # Given a holder whose lock slipped away before it asked for its token
    with pytest.raises(LockLost), redis_lock("edge-zero", ttl=0.2, renew=False) as lock:  # noqa: PT012
        time.sleep(0.3)
        # When it asks, or writes fenced to a key nobody has fenced yet
        with pytest.raises(LockLost):
            lock.fencing_token  # noqa: B018
        with pytest.raises(LockLost):
            lock.fenced_set("edge-zero:body", "stale")
    # Then nothing was written, and no token below 1 passes a fenced write either
    assert client.get("edge-zero:body") is None
    assert not fenced_set(client, "edge-zero:body", "stale", 0)
    assert client.get("edge-zero:body") is None


def test_a_redis_lock_object_is_good_for_one_block() -> None:
    client = get_redis_connection("default")
    block = redis_lock("edge-shared", ttl=5, wait=0, renew=False)  # e.g. a module-level lock
    with block as lock:
        # When a second thread (or a nested with) enters the same object
        with pytest.raises(RuntimeError, match="one with-block"), block:
            pass
        # Then the first holding is untouched
        assert client.get(lock.key) == lock.token.encode()
    assert client.exists(lock.key) == 0


def _in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running pytest's teardown
        try:
            os.close(read)
            os.write(write, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def test_a_forked_child_counts_only_its_own_acquisitions() -> None:
    stats.flush()
    # Given a process that took 10 locks without waiting (counted, not yet flushed)
    for n in range(10):
        with redis_lock(f"edge-fork-{n}", ttl=5, wait=0, renew=False):
            pass

    # When it forks and the child takes one lock and flushes
    def child() -> dict[str, Any]:
        with redis_lock("edge-fork-child", ttl=5, wait=0, renew=False):
            pass
        stats.flush()
        # the child's own metrics file (prometheus_client reopened it after the fork)
        return {"bucket0": metrics.LOCK_WAIT._buckets[0].get()}

    got = _in_child(child)
    stats.flush()
    # Then the child's file counts its one acquisition, not the parent's 10 too
    assert got["bucket0"] == 1, f"child wrote {got['bucket0']} zero-wait acquisitions for 1"


def test_a_forked_child_does_not_report_the_parents_held_lock() -> None:
    # Given a process holding a lock (flushed: the gauge says 1)
    with redis_lock("edge-fork-held", ttl=5, wait=0, renew=False):
        stats.flush()

        # When it forks (a multiprocessing pool inside a job, say) and the child
        # takes and releases a lock of its own
        def child() -> dict[str, Any]:
            with redis_lock("edge-fork-held-child", ttl=5, wait=0, renew=False):
                stats.flush()
                inside = metrics.LOCKS_HELD._value.get()
            stats.flush()
            return {"inside": inside, "after": metrics.LOCKS_HELD._value.get()}

        got = _in_child(child)
    stats.flush()
    # Then the child's livesum gauge counts its own lock only
    assert got == {"inside": 1, "after": 0}


def test_two_threads_of_one_holding_get_one_token() -> None:
    # Given one holding whose lock object is used by two threads (a job fanning
    # out its writes to a thread pool), neither having asked for the token yet
    client = get_redis_connection("default")
    with redis_lock("edge-two-tokens", ttl=5, wait=0) as lock:
        barrier = threading.Barrier(2)
        tokens: list[int] = []

        def ask() -> None:
            barrier.wait()
            tokens.append(lock.fencing_token)

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Then one holding has one token: with two, the holder would fence out
        # its own write (each thread writing with the token it was given)
        late = fenced_set(client, "edge-two-tokens:body", "late", max(tokens))
        early = fenced_set(client, "edge-two-tokens:body", "early", min(tokens))
        assert tokens[0] == tokens[1] == lock.fencing_token, (
            f"one holding got tokens {tokens}; writes accepted: late={late} early={early}"
        )


def test_an_exception_in_the_block_is_not_masked_by_lock_lost_and_the_lock_is_released() -> None:
    client = get_redis_connection("default")
    block = redis_lock("edge-raise", ttl=0.2, renew=False)
    with pytest.raises(ValueError, match="own error"), block:  # noqa: PT012
        time.sleep(0.3)
        raise ValueError("the block's own error")
    with pytest.raises(KeyError), redis_lock("edge-raise2", ttl=5, renew=True) as lock:  # noqa: PT012
        key = lock.key
        raise KeyError("x")
    assert client.exists(key) == 0


def test_a_forked_child_renews_its_own_locks() -> None:
    # Given a parent whose renewal thread is running (it renewed a lock before)
    with redis_lock("edge-fork-renew-parent", ttl=1) as lock:
        time.sleep(0.5)
        lock.check()

    # When a forked child (threads do not survive a fork) holds a lock past its TTL
    def child() -> dict[str, Any]:
        try:
            # 3x a 1 s TTL (renewal every 333 ms leaves room for a stall)
            with redis_lock("edge-fork-renew-child", ttl=1) as held:
                time.sleep(3)
                held.check()
        except LockLost:
            return {"kept": False}
        return {"kept": True}

    # Then its own renewal thread kept it
    assert _in_child(child) == {"kept": True}
