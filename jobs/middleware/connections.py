"""Database connections tidied around each job, only in threads that have one.

django-dramatiq's ``DbConnectionsMiddleware`` calls ``close_old_connections()``
before and after every message, as Django does around a request: a connection
past its ``CONN_MAX_AGE``, broken, or left in an error is closed, so the next
job opens a fresh one. Each call walks every database alias through the
connection handler's thread-local storage; in a worker thread whose jobs never
touched the database (most of a no-op drain, and every job that only talks to
Redis or SMTP) there is nothing to close, yet the two calls were about 4% of a
worker's Python time at 2 processes x 8 threads (py-spy, issue 17).

``DbConnections`` keeps the same behaviour and skips the walk in a thread that
has never opened a connection: Django sends ``connection_created`` from the
thread that connects, and a connection belongs to the thread that created it.
Once a thread has connected it is checked around every job, as before.
"""

from __future__ import annotations

import threading
from typing import Any

from django import db
from django.db.backends.signals import connection_created
from django_dramatiq.middleware import DbConnectionsMiddleware

_opened = threading.local()


def _note_connection(sender: Any, **kwargs: Any) -> None:
    _opened.any = True


# weak=False: a module-level function, connected once for the process.
connection_created.connect(_note_connection, weak=False, dispatch_uid=__name__)


def thread_has_connected() -> bool:
    """Whether this thread has ever opened a database connection."""
    return getattr(_opened, "any", False)


class DbConnections(DbConnectionsMiddleware):  # type: ignore[misc]
    """django-dramatiq's ``DbConnectionsMiddleware``, skipping threads without
    a database connection (see the module's docstring)."""

    def _close_old_connections(self, *args: Any, **kwargs: Any) -> None:
        if getattr(_opened, "any", False):
            db.close_old_connections()

    before_process_message = _close_old_connections
    after_process_message = _close_old_connections
