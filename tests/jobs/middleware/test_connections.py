"""Database connections are tidied around each job in threads that have one, and
threads that never used the database skip the walk over every alias."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import django.db
import dramatiq
import pytest
from django.db import connection

from jobs.ledger import writer as ledger
from jobs.middleware import connections as connections_module
from jobs.middleware.connections import DbConnections
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "connections-test"
# What each job saw of its thread's connection: (thread, open at start, open after its query)
seen: list[tuple[int, bool, bool]] = []


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def query_the_database() -> None:
    open_at_start = connection.connection is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    seen.append((threading.get_ident(), open_at_start, connection.connection is not None))


def test_the_shipped_broker_uses_it_in_place_of_django_dramatiqs(broker: dramatiq.Broker) -> None:
    names = [type(m).__name__ for m in broker.middleware]
    assert "DbConnections" in names
    assert "DbConnectionsMiddleware" not in names


def test_a_worker_thread_that_queried_closes_its_connection_after_each_job(
    broker: dramatiq.Broker, settings: Any
) -> None:
    # Given connections that must not outlive a job (CONN_MAX_AGE 0: the tests'
    # setting, and SQLite's everywhere) and one worker thread
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    # (the shipped ledger batches: with the tests' 0 the ledger would write from
    # the worker thread itself, and open its connection before the job starts)
    settings.JOBS_LEDGER_FLUSH_MS = 200
    seen.clear()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        # When that thread runs two jobs that query the database
        for _ in range(2):
            query_the_database.send()
        join(QUEUE)
    finally:
        worker.stop(timeout=10_000)
        ledger.flush()
    # Then each job opened the connection, and found it closed again at its start:
    # the middleware closed the first job's connection once the job was over
    [(first_thread, *_), (second_thread, *_)] = seen
    assert first_thread == second_thread
    assert [(start, after) for _, start, after in seen] == [(False, True), (False, True)]


def _in_a_new_thread(step: Callable[[], Any]) -> None:
    failure: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:  # (re-raised in the test's thread)
            failure.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    if failure:
        raise failure[0]


def test_a_thread_that_never_connected_skips_the_walk_and_one_that_did_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = django.db.close_old_connections

    def counted() -> None:  # Django's own, counted
        calls.append(threading.get_ident())
        real()

    monkeypatch.setattr(django.db, "close_old_connections", counted)
    middleware = DbConnections()
    outcome: dict[str, Any] = {}

    def step() -> None:
        # Given a fresh thread that never used the database
        outcome["connected before"] = connections_module.thread_has_connections()
        # When a job starts and ends there, nothing is walked
        middleware.before_process_message(None, None)
        middleware.after_process_message(None, None)
        outcome["calls without"] = len(calls)
        # When the thread opens a connection, both hooks check it again
        connection.ensure_connection()
        outcome["connected after"] = connections_module.thread_has_connections()
        middleware.before_process_message(None, None)
        middleware.after_process_message(None, None)
        outcome["calls with"] = len(calls)

    _in_a_new_thread(step)
    assert outcome == {
        "connected before": False,
        "calls without": 0,
        "connected after": True,
        "calls with": 2,
    }


def test_a_connection_whose_setup_failed_is_closed_after_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection can be open yet never announced (``connection_created`` is
    sent only once its setup succeeded): the server dropped it while the
    wrapper set the time zone or the role. The wrapper keeps it; only the
    middleware's close lets the thread's next job connect again. (Found by
    review: a flag set by that signal left such a thread failing every job.)"""
    middleware = DbConnections()
    outcome: list[str] = []

    def step() -> None:
        wrapper = django.db.connections["default"]
        real_setup = wrapper.init_connection_state
        failures = [django.db.OperationalError("server closed the connection")]

        def setup_dropped_once() -> None:
            if failures:
                wrapper.connection.close()  # the socket is gone; the wrapper holds it
                raise failures.pop()
            real_setup()

        monkeypatch.setattr(wrapper, "init_connection_state", setup_dropped_once)
        for _ in range(2):  # two jobs in this thread
            middleware.before_process_message(None, None)
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                outcome.append("ok")
            except django.db.Error as exc:
                outcome.append(type(exc).__name__)
            middleware.after_process_message(None, None)

    _in_a_new_thread(step)
    # The first job fails with the dropped connection; the second connects afresh.
    assert outcome == ["OperationalError", "ok"]


def test_a_wrapper_assigned_to_the_handler_and_connected_here_is_closed_after_the_job() -> None:
    """``connections[alias] = wrapper`` skips the handler's create_connection:
    the thread is marked when the wrapper connects in it. (Found by review.)"""
    middleware = DbConnections()
    outcome: dict[str, Any] = {}

    def step() -> None:
        # Given a thread that was handed a wrapper rather than creating one
        handler = django.db.connections
        # (the class's create_connection: made without passing the mark)
        handler["default"] = type(handler).create_connection(handler, "default")
        outcome["marked before"] = connections_module.thread_has_connections()
        # When a job there connects with it
        middleware.before_process_message(None, None)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        middleware.after_process_message(None, None)
        # Then the middleware closed it (CONN_MAX_AGE 0), as django-dramatiq's would
        outcome["open after the job"] = connection.connection is not None

    _in_a_new_thread(step)
    assert outcome == {"marked before": False, "open after the job": False}
