"""A Redis outage is told once per address and period, naming the settings, no traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from jobs.observability.outages import OutageFilter


class Lines(logging.Handler):
    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.lines: list[logging.LogRecord] = []
        self.addFilter(OutageFilter(every_s=every_s))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record)


@pytest.fixture
def closed_port_error(settings) -> redis.ConnectionError:
    port = int(settings.DRAMATIQ_BROKER["OPTIONS"]["url"].split(":")[2].split("/")[0])
    return redis.ConnectionError(f"Error 111 connecting to 127.0.0.1:{port}. Connection refused.")


@contextmanager
def captured(name: str, *, every_s: float) -> Iterator[tuple[logging.Logger, Lines]]:
    """A logger of the test's own with a filtered handler that keeps what passes."""
    handler = Lines(every_s=every_s)
    logger = logging.getLogger(f"tests.outages.{name}")
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def log_failure(logger: logging.Logger, error: Exception) -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as low:
            raise error from low
    except redis.ConnectionError:
        logger.exception("Worker heartbeat failed")


def test_it_turns_a_flood_of_tracebacks_into_one_line(closed_port_error) -> None:
    # Given 50 threads' worth of connection errors, each with its traceback
    with captured("flood", every_s=60) as (logger, handler):
        for _ in range(50):
            log_failure(logger, closed_port_error)
        logger.warning("an unrelated warning")
    # Then one line names where Redis should be and which settings point there
    [outage, unrelated] = handler.lines
    text = outage.getMessage()
    assert text.startswith("Redis at 127.0.0.1:")
    assert "(DRAMATIQ_BROKER and CACHES['default']) is unreachable" in text
    assert outage.exc_info is None
    assert unrelated.getMessage() == "an unrelated warning"


def test_it_says_again_once_a_period_how_many_it_left_out(closed_port_error) -> None:
    with captured("period", every_s=0.2) as (logger, handler):
        for _ in range(5):
            log_failure(logger, closed_port_error)
        import time

        time.sleep(0.25)
        log_failure(logger, closed_port_error)
    assert len(handler.lines) == 2
    assert "still unreachable" in handler.lines[1].getMessage()
    assert "4 more such line(s)" in handler.lines[1].getMessage()


def test_dramatiqs_consumer_lines_join_the_report(closed_port_error) -> None:
    with captured("consumer", every_s=60) as (logger, handler):
        for _ in range(3):
            logger.critical("Consumer encountered a connection error: %s", closed_port_error)
            logger.info("Restarting consumer in %0.2f seconds.", 3)
    assert len(handler.lines) == 1


# An extra alias only, never connected to: Django's warning about it does not apply.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_database_that_refuses_connections_is_told_once_by_its_alias(settings) -> None:
    from django.db import OperationalError

    settings.DATABASES = {
        **settings.DATABASES,
        "reports": {"ENGINE": "django.db.backends.postgresql", "HOST": "10.9.8.7", "PORT": 6543},
    }
    error = OperationalError(
        'connection failed: connection to server at "10.9.8.7", port 6543 failed: '
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
        "connections?"
    )
    with captured("database", every_s=60) as (logger, handler):
        for _ in range(10):
            logger.warning("Job ledger intake: database unreachable, entries kept: %s", error)
    [line] = handler.lines
    assert line.getMessage().startswith(
        "Database at 10.9.8.7:6543 (DATABASES['reports']) is unreachable: Job ledger intake"
    )
    assert "\n" not in line.getMessage()


def test_a_line_that_only_mentions_reconnecting_passes_untouched() -> None:
    with captured("other", every_s=60) as (logger, handler):
        for _ in range(3):
            logger.info("Reconnecting to 10.0.0.1:6379 after a failover")
    assert len(handler.lines) == 3


def test_the_applications_own_connecting_lines_pass_untouched() -> None:
    with captured("payments", every_s=60) as (logger, handler):
        for order in range(3):
            logger.info("connecting to api.stripe.com:443 for order %s", order)
    assert [r.getMessage() for r in handler.lines] == [
        f"connecting to api.stripe.com:443 for order {n}" for n in range(3)
    ]
    assert all(r.levelname == "INFO" for r in handler.lines)


def test_a_database_that_answers_with_an_error_keeps_its_traceback() -> None:
    from django.db import OperationalError

    error = OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  database "no_such_db" does not exist'
    )
    with captured("fatal", every_s=60) as (logger, handler):
        for _ in range(2):
            try:
                raise error
            except OperationalError:
                logger.exception("query failed")
    assert len(handler.lines) == 2
    assert all(r.exc_info is not None for r in handler.lines)


def test_a_record_that_cannot_be_rendered_passes_without_raising() -> None:
    # logging reports a bad format itself ("--- Logging error ---"); the filter
    # must not turn it into an exception in the code that logged.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d items", ("abc",), None)

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    failing = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "boom", (), (Unprintable, Unprintable(), None)
    )
    assert OutageFilter().filter(record) is True
    assert OutageFilter().filter(failing) is True


def test_an_outage_after_a_quiet_spell_is_told_as_new(closed_port_error) -> None:
    import time

    with captured("again", every_s=0.1) as (logger, handler):
        log_failure(logger, closed_port_error)
        time.sleep(0.25)
        log_failure(logger, closed_port_error)
    assert [" is unreachable" in r.getMessage() for r in handler.lines] == [True, True]
