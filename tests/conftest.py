from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import dramatiq
import pytest
from django.conf import settings
from django_redis import get_redis_connection
from dramatiq.broker import MessageProxy

from jobs.broker import redis_broker
from project.redis_server import RedisServer


@pytest.fixture(scope="session", autouse=True)
def redis_server() -> Iterator[str]:
    """The session's Redis: a private server unless REDIS_URL was given."""
    if os.environ.get("TEST_MANAGED_REDIS") != "1":
        yield settings.REDIS_URL
        return
    port = urlsplit(settings.REDIS_URL).port
    assert port is not None
    server = RedisServer(port, Path(os.environ["TEST_TMP_DIR"]) / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _flush_redis(redis_server: str) -> Iterator[None]:
    """Each test starts and ends with empty broker and cache databases."""
    broker = redis_broker()
    broker.client.flushdb()
    get_redis_connection("default").flushdb()
    yield
    broker.client.flushdb()
    get_redis_connection("default").flushdb()


@pytest.fixture
def broker() -> dramatiq.Broker:
    return dramatiq.get_broker()


def _messages_in(hash_name: str) -> list[dramatiq.Message[object]]:
    broker = redis_broker()
    raw = cast(list[bytes], broker.client.hvals(f"{broker.namespace}:{hash_name}"))
    return [dramatiq.Message.decode(data) for data in raw]


def queued_messages(queue_name: str) -> list[dramatiq.Message[object]]:
    """Messages waiting in ``queue_name`` on the real Redis broker."""
    return _messages_in(f"{queue_name}.msgs")


def dead_messages(queue_name: str) -> list[dramatiq.Message[object]]:
    """Messages Dramatiq dead-lettered (failed for good) from ``queue_name``."""
    return _messages_in(f"{queue_name}.XQ.msgs")


class AttemptRecorder(dramatiq.Middleware):
    """Records every processing attempt: (message id, monotonic start, exception)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, float, BaseException | None]] = []
        self._started: dict[str, float] = {}

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started[message.message_id] = time.monotonic()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: object = None,
        exception: BaseException | None = None,
    ) -> None:
        # A middleware before this one may have stopped the message before our
        # before_process_message ran (an invalid payload): count it all the same.
        started = self._started.pop(message.message_id, time.monotonic())
        self.attempts.append((message.message_id, started, exception))


@pytest.fixture
def attempts(broker: dramatiq.Broker) -> Iterator[AttemptRecorder]:
    recorder = AttemptRecorder()
    broker.middleware.append(recorder)
    yield recorder
    broker.middleware.remove(recorder)


@pytest.fixture(scope="session")
def booted_broker() -> dramatiq.Broker:
    """The broker after "process boot": what ``rundramatiq`` does before working.

    In-process workers skip that hook, and TimeLimit starts its watchdog there.
    """
    broker = dramatiq.get_broker()
    broker.emit_after("process_boot")
    return broker


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    """A real in-process Dramatiq worker on the real Redis broker."""
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    yield worker
    worker.stop(timeout=10_000)


def join(queue_name: str, *, timeout_ms: int = 15_000) -> None:
    """Wait until ``queue_name`` (waiting, delayed and in-flight) is empty."""
    dramatiq.get_broker().join(queue_name, timeout=timeout_ms)


def use_mail_backend(settings: Any, backend: str) -> None:
    """Point the default mailer at ``backend``: MAILERS on Django 6.1+, EMAIL_BACKEND before."""
    if hasattr(settings, "MAILERS"):
        settings.MAILERS = {"default": {"BACKEND": backend}}
    else:
        settings.EMAIL_BACKEND = backend
