"""The project's URLs plus views that meet database faults, for the 503 tests."""

from __future__ import annotations

import psycopg
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from project.urls import *  # noqa: F403 - handler500 and the rest, as the project has them
from project.urls import urlpatterns as project_urlpatterns


def terminate_this_connection() -> None:
    """Drop this thread's PostgreSQL connection from the server side, as a restart does."""
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def missing_table(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:  # SQLite: OperationalError "no such table"
        cursor.execute("SELECT * FROM jobs_no_such_table")
    return HttpResponse("unreachable")


def statement_timeout(request: HttpRequest) -> HttpResponse:
    with transaction.atomic(), connection.cursor() as cursor:  # QueryCanceled, 57014
        cursor.execute("SET LOCAL statement_timeout = 10")
        cursor.execute("SELECT pg_sleep(1)")
    return HttpResponse("unreachable")


def lost_connection(request: HttpRequest) -> HttpResponse:
    connection.ensure_connection()
    terminate_this_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HttpResponse("unreachable")


urlpatterns = [
    *project_urlpatterns,
    path("faults/missing-table", missing_table),
    path("faults/statement-timeout", statement_timeout),
    path("faults/lost-connection", lost_connection),
    path("api/faults/lost-connection", lost_connection),
]
