"""Live workers are not judged dead by a skewed clock or right after an outage.

Dramatiq's maintenance (dispatch.lua, with the platform's prefix) requeues the
running messages of a worker whose heartbeat is older than the timeout. These
tests drive the real script on a private Redis with the broker ids of three
actors: a worker W holding a running message, a bystander worker that keeps
Redis in contact, and a judge J that runs maintenance. They force each
interleaving (a clock far ahead; SIGSTOP of Redis past the timeout, then J's
maintenance first), so each fails on the code before jobs.broker.clock every
time. Issue 29, item 4.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.broker import clock, redis_broker
from project.redis_server import RedisServer
from tests.e2e.conftest import free_port

NS = "clocktest"
QUEUE = "q"
TIMEOUT_MS = 1_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path / "redis", appendonly=False).start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    yield client
    client.close()


class Dispatch:
    """The broker's dispatch script as each actor sends it, with its own clock."""

    def __init__(self, client: redis.Redis) -> None:
        self.script = client.register_script(redis_broker().scripts["dispatch"].script)

    def __call__(
        self, command: str, worker: str, *extra: Any, maintenance: bool = False, skew_ms: int = 0
    ) -> Any:
        args = [
            command,
            int(time.time() * 1000) + skew_ms,
            QUEUE,
            worker,
            TIMEOUT_MS,
            86_400_000,
            int(maintenance),
            7999,
            *extra,
        ]
        return self.script(keys=[NS], args=args)


@contextlib.contextmanager
def bystander(dispatch: Dispatch) -> Iterator[threading.Event]:
    """Another live worker: in contact with Redis every 100 ms, until stopped."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(redis.RedisError):
                dispatch("qsize", "bystander")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join()


def running_message(client: redis.Redis, dispatch: Dispatch) -> None:
    """W fetches a message and runs it (its id in W's ack set)."""
    client.rpush(f"{NS}:{QUEUE}", "m1")
    client.hset(f"{NS}:{QUEUE}.msgs", "m1", "payload")
    assert dispatch("fetch", "W", 1) == [b"payload"]


def requeued(client: redis.Redis) -> bool:
    """Whether maintenance handed W's message back to the queue (a second start)."""
    return client.lrange(f"{NS}:{QUEUE}", 0, -1) == [b"m1"]


def settle(dispatch: Dispatch) -> None:
    """Past one timeout of contact (W beating), so that maintenance may judge."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000 * 1.2
    while time.monotonic() < deadline:
        dispatch("qsize", "W")
        time.sleep(0.1)


def judge_until(client: redis.Redis, dispatch: Dispatch, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        dispatch("qsize", "J", maintenance=True)
        if requeued(client):
            return True
        time.sleep(0.05)
    return False


def test_a_judge_whose_clock_runs_ahead_finds_no_live_worker_dead(
    client: redis.Redis,
) -> None:
    dispatch = Dispatch(client)
    with bystander(dispatch):
        running_message(client, dispatch)
        settle(dispatch)

        # When a host whose clock runs 5 timeouts ahead runs maintenance
        dispatch("qsize", "W")
        dispatch("qsize", "J", maintenance=True, skew_ms=5 * TIMEOUT_MS)

        # Then W, which beat a moment ago, keeps its message
        assert not requeued(client)

        # and a W that really stopped is still found dead, after the timeout
        assert judge_until(client, dispatch, seconds=5)


def test_after_an_outage_longer_than_the_timeout_no_live_worker_is_judged_dead(
    server: RedisServer, client: redis.Redis
) -> None:
    dispatch = Dispatch(client)
    assert server.process is not None
    with bystander(dispatch) as stop_bystander:
        running_message(client, dispatch)
        settle(dispatch)
        dispatch("qsize", "W")
        stop_bystander.set()  # Redis is about to be cut off from everyone

    # Given Redis hung past the timeout (nobody can beat)
    os.kill(server.process.pid, signal.SIGSTOP)
    time.sleep(2.5 * TIMEOUT_MS / 1000)
    os.kill(server.process.pid, signal.SIGCONT)

    # When the judge is the first to reach it again
    dispatch("qsize", "J", maintenance=True)

    # Then W's running message stays W's, and its run_once claims stay held
    assert not requeued(client)
    assert clock.holder_alive(client, NS, "W", TIMEOUT_MS)

    # and once the live workers have beaten again, W (alive) is still spared
    with bystander(dispatch):
        settle(dispatch)
        dispatch("qsize", "J", maintenance=True)
        assert not requeued(client)

        # while a W that stopped beating is found dead once its timeout passes
        assert judge_until(client, dispatch, seconds=5)
        assert not clock.holder_alive(client, NS, "W", TIMEOUT_MS)


def test_after_an_outage_a_claim_asked_about_first_still_has_a_live_holder(
    server: RedisServer, client: redis.Redis
) -> None:
    # Given W beating (holding a run_once claim) with Redis in contact for long
    dispatch = Dispatch(client)
    assert server.process is not None
    with bystander(dispatch):
        settle(dispatch)
        dispatch("qsize", "W")

    # and Redis hung past the timeout
    os.kill(server.process.pid, signal.SIGSTOP)
    time.sleep(2.5 * TIMEOUT_MS / 1000)
    os.kill(server.process.pid, signal.SIGCONT)

    # When another job's run_once asks about the claim's holder before anything
    # else reaches Redis, Then W is alive (before: dead, and the claim taken over)
    assert clock.holder_alive(client, NS, "W", TIMEOUT_MS)


def test_a_redis_restarted_empty_judges_no_holder_for_a_timeout(client: redis.Redis) -> None:
    # Given a Redis that lost every heartbeat (restarted without persistence)
    client.flushall()

    # Then a claim's holder is not judged dead before it could beat again
    assert clock.holder_alive(client, NS, "W", TIMEOUT_MS)
    # (and one that does not beat within a timeout of contact is)
    with bystander(Dispatch(client)):
        time.sleep(TIMEOUT_MS / 1000 * 1.2)
        assert not clock.holder_alive(client, NS, "W", TIMEOUT_MS)
