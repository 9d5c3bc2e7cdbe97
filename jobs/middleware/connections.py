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
holds no connection wrapper: ``close_old_connections()`` looks only at the
wrappers this thread created (``connections.all(initialized_only=True)``), so
with none it has nothing to do. A thread gets a wrapper when it first uses an
alias, through the connection handler's ``create_connection``; that is where
the thread is marked, once. Not only on Django's ``connection_created``
signal: it is sent only after a connection's setup succeeded, and a connection
whose setup failed (a server that dropped it during ``SET TIME ZONE``, a role
that does not exist) stays on its wrapper, broken, until this middleware
closes it. The signal marks too, for a wrapper assigned to the handler
(``connections[alias] = wrapper``) and connected in this thread; a wrapper
assigned already connected, in a thread that never made one, is not seen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django import db
from django.db.backends.signals import connection_created
from django_dramatiq.middleware import DbConnectionsMiddleware

_marked = threading.local()


def _mark(*args: Any, **kwargs: Any) -> None:
    _marked.any = True


def _mark_threads(handler: Any) -> None:
    """Have ``handler`` mark each thread that creates a connection wrapper."""
    create: Callable[[str], Any] = handler.create_connection
    # This module's mark, not any: a copy of the module imported under another
    # name has a flag of its own to set.
    if getattr(create, "marks", None) is _marked:
        return

    def create_connection(alias: str) -> Any:
        _mark()
        return create(alias)

    create_connection.marks = _marked  # type: ignore[attr-defined]
    # On the handler instance, not its class: a subclass's own method still runs.
    handler.create_connection = create_connection


_mark_threads(db.connections)
# Also every thread that connects: a wrapper put in place by assignment
# (``connections[alias] = wrapper``) skips create_connection.
connection_created.connect(_mark, weak=False, dispatch_uid=f"{__name__}.{id(_marked)}")


def thread_has_connections() -> bool:
    """Whether this thread has created a database connection wrapper (and so
    may hold a connection)."""
    return getattr(_marked, "any", False)


class DbConnections(DbConnectionsMiddleware):  # type: ignore[misc]
    """django-dramatiq's ``DbConnectionsMiddleware``, skipping threads that
    hold no connection wrapper (see the module's docstring)."""

    def _close_old_connections(self, *args: Any, **kwargs: Any) -> None:
        if thread_has_connections():
            db.close_old_connections()

    before_process_message = _close_old_connections
    after_process_message = _close_old_connections
