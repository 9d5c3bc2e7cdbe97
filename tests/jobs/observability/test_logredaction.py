"""A failing job's password reaches no log line: real worker, the project's LOGGING."""

from __future__ import annotations

import copy
import io
import json
import logging.config
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from django.conf import settings
from django.test import Client

from jobs.errors import PermanentJobError
from tests.conftest import join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "log-redaction-test"
SECRET = "hunter2"
# A denial-of-service bound, not a speed benchmark: the filter used to spend
# 1.4 s of CPU on the log line of one such request; now it takes milliseconds.
DOS_BOUND_S = 0.5


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def log_in(user_id: int, password: str) -> None:
    # An error that echoes its input, as client libraries' errors often do.
    raise ConnectionRefusedError(f"login refused for {user_id}: password={password!r}")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def check_pin(user_id: int, password: str) -> None:
    try:
        int(password)  # a library error that echoes its input without naming it
    except ValueError as exc:
        raise PermanentJobError(str(exc)) from exc


# Code without source lines in its tracebacks (generated code, .pyc-only
# deploys): there the exception's line directly follows a "File" line.
_generated: dict[str, Any] = {}
exec(
    compile(
        "def connect():\n    raise ValueError('bad credentials password=hunter2')\n",
        "<generated>",
        "exec",
    ),
    _generated,
)


@pytest.fixture(params=["plain", "json"])
def log_output(request: pytest.FixtureRequest) -> Iterator[io.StringIO]:
    """What the project's console handler writes, in either format, at DEBUG."""
    stream = io.StringIO()
    config: dict[str, Any] = copy.deepcopy(settings.LOGGING)
    config["handlers"]["console"].update(formatter=request.param, stream=stream)
    config["root"]["level"] = "DEBUG"  # Dramatiq's debug lines show the message too
    logging.config.dictConfig(config)
    try:
        yield stream
    finally:
        logging.config.dictConfig(settings.LOGGING)


def test_it_keeps_a_failing_jobs_password_out_of_every_log_line(
    worker: dramatiq.Worker, log_output: io.StringIO
) -> None:
    # Given a job sent with a password that fails
    log_in.send(7, password=SECRET)
    log_in.send(8, SECRET)  # positional: redacted by its parameter's name all the same

    # When the worker runs it and logs the failure
    join(QUEUE)
    worker.join()
    text = log_output.getvalue()

    # Then the password is nowhere, though the failures were logged with their tracebacks
    assert SECRET not in text
    assert "Failed to process message log_in(7, password='[redacted]')" in text
    assert "Failed to process message log_in(8, '[redacted]')" in text
    assert "ConnectionRefusedError: login refused for 7: password='[redacted]'" in text
    if text.lstrip().startswith("{"):
        failures = [json.loads(line) for line in text.splitlines() if "Failed to process" in line]
        assert len(failures) == 2
        assert all("ConnectionRefusedError" in line["exc_info"] for line in failures)


def test_it_keeps_a_secret_echoed_without_its_name_out_of_the_logs(
    worker: dramatiq.Worker, log_output: io.StringIO
) -> None:
    # Given jobs whose password ends up, unnamed, in their errors
    check_pin.send(7, password=SECRET)
    check_pin.send(8, SECRET)

    # When the worker logs their failures (its own line, with the traceback,
    # and the Retries middleware's, which names the message by id only)
    join(QUEUE)
    worker.join()
    text = log_output.getvalue()

    # Then the password is in none of those lines
    assert SECRET not in text
    assert text.count("with base 10: '[redacted]'): not retried.") == 2
    assert "ValueError: invalid literal for int() with base 10: '[redacted]'" in text


def test_it_masks_an_exception_line_that_follows_a_frame_without_source(
    log_output: io.StringIO,
) -> None:
    # Given an error raised in code whose source the traceback cannot show
    try:
        _generated["connect"]()
    except ValueError:
        # When it is logged with its traceback
        logging.getLogger("tests.generated").exception("Connecting failed")
    text = log_output.getvalue()

    # Then its line is redacted like any other
    assert "<generated>" in text  # the frame without source is in the traceback
    assert SECRET not in text
    assert "ValueError: bad credentials password=[redacted]" in text


def test_it_answers_a_long_hyphenated_404_in_bounded_time(
    client: Client, log_output: io.StringIO
) -> None:
    # Given a 4 KB hyphenated path (under gunicorn's 4094-byte request line),
    # which Django logs as "Not Found: <path>" through the redacting filter
    path = "/" + "a-" * 2000
    client.get("/no-such-page/")  # the first request loads the URLconf

    # When an anonymous client asks for it
    # (CPU time of this thread, which runs the request: a loaded machine's
    # pauses would count in wall time)
    started = time.thread_time()
    response = client.get(path)
    elapsed = time.thread_time() - started

    # Then the answer comes in bounded CPU time, and the path was logged
    assert response.status_code == 404
    assert f"Not Found: {path}" in log_output.getvalue()
    assert elapsed < DOS_BOUND_S, f"a 404 took {elapsed:.2f} s"
