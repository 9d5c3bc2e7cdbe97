"""The writer's per-connection plan goes with its connection (both databases)."""

from __future__ import annotations

import gc
import threading
import weakref

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from jobs.ledger import upsert


def test_a_finished_threads_connection_is_not_kept_alive_by_its_plan() -> None:
    # Given threads that each wrote through their own connection (each thread
    # has its own wrapper; its plan holds the wrapper's ops)
    wrappers: list[weakref.ref[BaseDatabaseWrapper]] = []

    def work() -> None:
        conn = connections[DEFAULT_DB_ALIAS]
        assert upsert._plan(conn) is upsert._plan(conn)  # built once per connection
        wrappers.append(weakref.ref(conn))

    threads = [threading.Thread(target=work) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # When the threads are gone
    gc.collect()
    # Then so are their connection wrappers (and any connection they held open)
    alive = [ref for ref in wrappers if ref() is not None]
    assert not alive, f"{len(alive)} of {len(wrappers)} finished threads' connections kept"
