"""A database that is away answers 503 with Retry-After, never a 500 traceback page.

A PostgreSQL restart or failover drops every connection: the request that hits
it gets a clear "try again" (JSON for the API), the error is logged once as a
warning, and Django opens a fresh connection for the next request.

Two hooks, because Django turns an exception into a response in the layer that
raised it: ``DatabaseUnavailableMiddleware.process_exception`` sees what the
view raised, and ``server_error`` (the project's ``handler500``) sees what any
middleware raised, e.g. ``SessionMiddleware`` saving the session after the
view's transaction committed. With ``DEBUG`` on, Django shows its debug page
instead of calling ``handler500``: a developer gets the traceback.

Only a lost connection is an outage. ``OperationalError`` also covers a
missing table (SQLite), a statement or lock timeout and a deadlock
(PostgreSQL): bugs or load, which stay a 500 with the traceback logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import requires_csrf_token

try:
    import psycopg
except ImportError:  # SQLite only: it has no connection to lose
    psycopg = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 5
# SQLSTATEs of a connection that failed, as opposed to a statement that did:
# class 08 (connection exception), 57P01 admin shutdown (a fast or immediate
# stop), 57P02 crash shutdown, 57P03 cannot connect now (starting up, recovering).
_LOST_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def is_outage(exception: BaseException) -> bool:
    """Whether ``exception`` says the database is out of reach (not that a query failed)."""
    if not isinstance(exception, OperationalError | InterfaceError):
        return False
    # Django raises its own class "from" the driver's error: the driver says why.
    cause = exception.__cause__
    if psycopg is None or not isinstance(cause, psycopg.Error):
        return False
    # No SQLSTATE: the client lost or never got its connection ("server closed
    # the connection unexpectedly", "connection refused", "the connection is closed").
    return cause.sqlstate is None or cause.sqlstate.startswith(_LOST_CONNECTION_STATES)


# SQLite's result codes for a write lock held too long by another connection.
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
# PostgreSQL: lock_not_available (lock_timeout), deadlock, serialization failure.
_LOCK_STATES = ("55P03", "40P01", "40001")


def is_lock_contention(exception: BaseException) -> bool:
    """Whether ``exception`` says another transaction held a lock too long: the
    same statement can succeed once it is released (not an outage: a request
    still gets its 500, but a write that must not be lost may try again)."""
    if not isinstance(exception, OperationalError):
        return False
    cause = exception.__cause__
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)  # extended codes too
    if psycopg is not None and isinstance(cause, psycopg.Error):
        return cause.sqlstate in _LOCK_STATES
    return False


def unavailable(request: HttpRequest, exception: BaseException) -> HttpResponse:
    """The 503 answer to an outage, logged once as a warning."""
    logger.warning("Database unavailable, answered 503: %s", exception)
    # The broken connection must not serve the next request of this thread.
    close_old_connections()
    message = "The service is briefly unavailable; try again in a few seconds."
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"errors": {"service": [message]}}, status=503)
    else:
        response = HttpResponse(message, status=503, content_type="text/plain")
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return unavailable(request, exception) if is_outage(exception) else None


@requires_csrf_token
def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: an outage met outside the view is a 503 too; the rest, Django's 500."""
    exception = sys.exc_info()[1]
    if exception is None or not is_outage(exception):
        return defaults.server_error(request)
    response = unavailable(request, exception)
    # Logged above as the warning it is: Django would log any 5xx it handled
    # as an error with the traceback (django.utils.log.log_response).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
