from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlencode, urlsplit

import dramatiq
import pytest
from django.conf import settings
from django.db import connection
from django_redis import get_redis_connection
from dramatiq.broker import MessageProxy

from jobs.broker import redis_broker
from jobs.concurrency import limits, takes
from jobs.consistency import reachability
from jobs.ledger import writer as ledger
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


def database_url(database: dict[str, Any] | None = None) -> str:
    """``DATABASE_URL`` for ``database`` (default: the one this process uses), SQLite or PostgreSQL.

    Call it once the test database exists (the ``test_database_url`` fixture does),
    so a subprocess gets the test database and not the one it was named after.
    """
    database = database or connection.settings_dict
    engine = database["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        return f"sqlite:///{database['NAME']}"
    if engine == "django.db.backends.postgresql":
        user = quote(database.get("USER") or "", safe="")
        password = quote(database.get("PASSWORD") or "", safe="")
        credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
        # A unix socket directory as the host is percent-encoded, "/" included.
        host = quote(str(database.get("HOST") or ""), safe="")
        port = f":{database['PORT']}" if database.get("PORT") else ""
        options = database.get("OPTIONS") or {}
        query = f"?{urlencode(options)}" if options else ""
        return f"postgres://{credentials}{host}{port}/{quote(database['NAME'], safe='')}{query}"
    raise NotImplementedError(f"no DATABASE_URL for a subprocess on {engine}")


@pytest.fixture(scope="session")
def test_database_url(django_db_setup: None) -> str:
    """``DATABASE_URL`` of the session's test database, for subprocesses that share it.

    Their writes are visible to the test (and the test's to them) only once
    committed: tests using it need ``django_db(transaction=True)`` or no database.
    """
    return database_url()


@pytest.fixture(autouse=True)
def _redis_reachable() -> Iterator[None]:
    """A test that broke Redis leaves no 'unreachable a moment ago' to the next one."""
    reachability.reset()
    yield
    reachability.reset()


@pytest.fixture(autouse=True)
def _flush_redis(redis_server: str) -> Iterator[None]:
    """Each test starts and ends with empty broker and cache databases (and no
    concurrency limit overrides this process read from the last one, nor the
    slot takes it knew of: a test may leave a slot taken it never releases)."""
    broker = redis_broker()
    broker.client.flushdb()
    get_redis_connection("default").flushdb()
    limits.forget()
    takes.forget()
    yield
    broker.client.flushdb()
    get_redis_connection("default").flushdb()
    limits.forget()
    takes.forget()


@pytest.fixture(autouse=True)
def _no_stale_workers() -> Iterator[None]:
    """Take the test's workers off the shared broker once it ends.

    ``dramatiq.Worker`` adds a middleware to the broker that starts a consumer
    for each queue declared later, and ``Worker.stop()`` leaves it there: a
    stopped worker of an earlier test would consume (and strand) messages of a
    queue a later test declares.
    """
    broker = dramatiq.get_broker()
    yield
    broker.middleware[:] = [m for m in broker.middleware if type(m).__name__ != "_WorkerMiddleware"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.one_row("sqlite", why)``: a test whose outcome does not
    depend on the suite's database (it brings its own, or touches only Redis
    and processes) runs in that row only; the other row says why it skips."""
    marker = item.get_closest_marker("one_row")
    if marker is None:
        return
    vendor, why = _one_row_args(*marker.args, **marker.kwargs)
    if connection.vendor != vendor:
        pytest.skip(reason=f"runs in the {vendor} row only: {why}")


def _one_row_args(vendor: str, why: str) -> tuple[str, str]:
    # A misspelt vendor would skip the test in both rows.
    if vendor not in ("sqlite", "postgresql"):
        raise pytest.UsageError(f"one_row: vendor must be 'sqlite' or 'postgresql', not {vendor!r}")
    return vendor, why


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


def wait_until(predicate: Callable[[], object], timeout: float = 15, every: float = 0.01) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds.

    What tests wait on instead of fixed sleeps, which a loaded machine outlasts.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s")
        time.sleep(every)


class AttemptRecorder(dramatiq.Middleware):
    """Records every processing attempt: (message id, monotonic start, exception)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, float, BaseException | None]] = []
        self._started: dict[str, float] = {}

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started[message.message_id] = time.monotonic()

    def is_running(self, message_id: str) -> bool:
        """Whether an attempt of the message has started and not ended yet."""
        return message_id in self._started

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


# worker_timeout of the in-process workers: how long an idle consumer waits
# between two fetches. A Worker consumes every queue declared so far, two
# consumers each (the queue and its delay queue), and once the whole suite is
# imported that is about 50 consumers: at 50 ms they made 2,000 Redis calls a
# second and starved the test process of the GIL (in CI a test's single worker
# thread started a job every 0.8 s). A wake-up token still starts a job at once
# (jobs.broker.wakeup); this bounds only an idle poll and how long a stop takes.
IDLE_POLL_MS = 250


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    """A real in-process Dramatiq worker on the real Redis broker."""
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=4)
    worker.start()
    yield worker
    worker.stop(timeout=10_000)
    # Write what the batch writer still holds now, not into the next test's database.
    ledger.flush()


@pytest.fixture(autouse=True)
def _in_process_timings(request: pytest.FixtureRequest, settings: Any) -> None:
    """In-process tests read the ledger and control marks right after a step.

    The shipped values (200 ms ledger batches, 1 s control refresh, 5 s pause
    recheck) would make each of them wait. They stay in force for the e2e tests
    (marked ``e2e``: the live server and every worker subprocess run with what
    ships) and for the tests that set them back (test_ledger's batching,
    test_control's refresh).
    """
    if request.node.get_closest_marker("e2e"):
        return
    settings.JOBS_LEDGER_FLUSH_MS = 0
    settings.JOBS_CONTROL_REFRESH_MS = 0
    settings.JOBS_PAUSE_RECHECK_MS = 100


def join(queue_name: str, *, timeout_ms: int = 15_000) -> None:
    """Wait until ``queue_name`` (waiting, delayed and in-flight) is empty."""
    dramatiq.get_broker().join(queue_name, timeout=timeout_ms)


def use_mail_backend(settings: Any, backend: str) -> None:
    """Point the default mailer at ``backend``: MAILERS on Django 6.1+, EMAIL_BACKEND before."""
    if hasattr(settings, "MAILERS"):
        settings.MAILERS = {"default": {"BACKEND": backend}}
    else:
        settings.EMAIL_BACKEND = backend


_PASSED = pytest.StashKey[bool]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus == pytest.ExitCode.OK


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's scratch directory (databases, Redis files, metrics,
    logs) after a passing run: a developer's /tmp held 1,554 of them (4.7 GB).
    Here, after the terminal summary, which reads the fault matrix from it. A
    failing run keeps it for the post-mortem (the summary says where)."""
    if getattr(settings, "TEST_TMP_OWNED", False) and config.stash.get(_PASSED, False):
        shutil.rmtree(settings.TEST_TMP, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault matrix of this run (tests/fault_matrix.py), if a fault test ran."""
    from tests import fault_matrix

    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_line(f"this run's logs, databases and metrics: {settings.TEST_TMP}")
    found = fault_matrix.rows()
    if found:
        terminalreporter.section("fault matrix")
        for line in fault_matrix.table(found):
            terminalreporter.write_line(line)
