"""A lost database answers 503 with Retry-After wherever the request meets it; a
failing query that is not an outage stays a 500 with its traceback logged."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.db import OperationalError, connection
from django.test import Client

from tests.jobs.observability.outage_urls import terminate_this_connection

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.jobs.observability.outage_urls"),
]
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs a PostgreSQL connection to lose"
)
FORM = {
    "username": "ann",
    "email": "ann@example.com",
    "password1": "a-Long-pass-2024!",
    "password2": "a-Long-pass-2024!",
}


def client() -> Client:
    # As a server answers: the response Django built, not the exception re-raised.
    return Client(raise_request_exception=False)


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_it_answers_503_when_the_connection_is_lost_as_the_session_is_saved(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a database that goes away after the signup committed, before
    # SessionMiddleware saves the session (outside the view): Django raises its
    # OperationalError from the driver's, as it does when PostgreSQL restarts
    def save(self: SessionStore, must_create: bool = False) -> None:
        lost = psycopg.OperationalError("server closed the connection unexpectedly")
        raise OperationalError(str(lost)) from lost

    monkeypatch.setattr(SessionStore, "save", save)

    # When the user signs up
    response = client().post("/accounts/signup/", FORM)

    # Then the answer says "try again" (the user exists: a retry meets the form's
    # "already taken", which is honest), logged as a warning, not a 500 traceback
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert User.objects.filter(username="ann").exists()
    assert "Database unavailable, answered 503" in caplog.text
    assert errors_logged(caplog) == []


@postgresql_only
def test_it_answers_503_when_postgresql_drops_the_connection_before_the_session_is_saved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given PostgreSQL terminating this request's connection (a restart, a
    # failover) between the signup's commit and the session save
    save = SessionStore.save

    def save_on_a_lost_connection(self: SessionStore, must_create: bool = False) -> None:
        terminate_this_connection()
        save(self, must_create)

    monkeypatch.setattr(SessionStore, "save", save_on_a_lost_connection)

    # When the user signs up
    response = client().post("/accounts/signup/", FORM)

    # Then the real driver error is an outage: 503 with Retry-After
    assert response.status_code == 503
    assert response["Retry-After"] == "5"


@postgresql_only
@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/faults/lost-connection", "text/plain"),
        ("/api/faults/lost-connection", "application/json"),
    ],
)
def test_it_answers_503_when_a_view_meets_a_dropped_connection(
    path: str, content_type: str
) -> None:
    # Given a view whose connection PostgreSQL terminates before its query
    # When it is requested
    response = client().get(path)

    # Then the answer is a 503 in the caller's format, and the next request works
    assert response.status_code == 503
    assert response["Content-Type"].startswith(content_type)
    assert response["Retry-After"] == "5"
    assert client().get("/accounts/signup/").status_code == 200


def test_it_answers_500_and_logs_the_traceback_for_a_missing_table(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a query on a table that does not exist (a forgotten migration, a bug):
    # SQLite reports it as an OperationalError, like a lost connection
    # When the view runs it
    response = client().get("/faults/missing-table")

    # Then it is a server error, with the traceback in the log, not "briefly unavailable"
    assert_server_error(response, caplog)


@postgresql_only
def test_it_answers_500_and_logs_the_traceback_for_a_statement_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a statement PostgreSQL cancels for its statement_timeout (an
    # OperationalError, QueryCanceled): a slow query, not an outage
    # When the view runs it
    response = client().get("/faults/statement-timeout")

    # Then it is a server error with the traceback logged
    assert_server_error(response, caplog)


def assert_server_error(response: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert response.status_code == 500
    assert "Retry-After" not in response
    [logged] = errors_logged(caplog)
    assert logged.exc_info is not None
    assert "Database unavailable" not in caplog.text
