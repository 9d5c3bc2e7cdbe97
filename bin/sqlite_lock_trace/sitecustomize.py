"""Log where SQLite's write lock is held or waited for, in every Python process
started with this folder on PYTHONPATH (``bin/trace-sqlite-locks``).

On SQLite a transaction holds the database's only write lock from its
``BEGIN IMMEDIATE`` (our setting) to its end, and a writer waiting for it polls
until the busy timeout. "database is locked" means a write waited that long;
the writer that held the lock is elsewhere. Each process appends to
``SQLITE_LOCK_TRACE`` one record per transaction that held the lock longer
than ``SQLITE_LOCK_TRACE_S`` (with the stack that opened it), per statement
that took that long (a lock wait, mostly), and per "database is locked".
A diagnostic: it patches Django's SQLite backend as it is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

OUT = os.environ.get("SQLITE_LOCK_TRACE", "sqlite-locks.log")
LONG_S = float(os.environ.get("SQLITE_LOCK_TRACE_S", "0.25"))
BACKEND = "django.db.backends.sqlite3.base"


def _write(kind: str, fields: str, stack: str = "") -> None:
    where = f"pid={os.getpid()} thread={threading.current_thread().name} at={time.time():.3f}"
    with open(OUT, "a") as out:
        out.write(f"=== {kind} {where} {fields}\n{stack}")


def _patch(base: Any) -> None:
    wrapper = base.DatabaseWrapper
    begin, commit, rollback = (
        wrapper._start_transaction_under_autocommit,
        wrapper._commit,
        wrapper._rollback,
    )

    def traced_begin(self: Any) -> None:
        begin(self)  # returns once the lock is ours: the wait shows as a slow statement
        self._lock_trace = (time.monotonic(), "".join(traceback.format_stack(limit=40)))

    def ending(kind: str, end: Callable[[Any], None]) -> Callable[[Any], None]:
        def traced(self: Any) -> None:
            opened = getattr(self, "_lock_trace", None)
            self._lock_trace = None
            end(self)
            if opened and (held := time.monotonic() - opened[0]) > LONG_S:
                _write("HELD", f"held={held:.2f}s ended_by={kind}", opened[1])

        return traced

    wrapper._start_transaction_under_autocommit = traced_begin
    wrapper._commit = ending("commit", commit)
    wrapper._rollback = ending("rollback", rollback)

    cursor = base.SQLiteCursorWrapper
    execute = cursor.execute

    def traced_execute(self: Any, query: str, params: Sequence[Any] | None = None) -> Any:
        started = time.monotonic()
        try:
            return execute(self, query, params)
        except Exception as exc:
            if "locked" in str(exc):
                took = time.monotonic() - started
                stack = "".join(traceback.format_stack(limit=40))
                _write("LOCKED", f"waited={took:.2f}s query={query[:120]!r}", stack)
            raise
        finally:
            if (took := time.monotonic() - started) > LONG_S:
                _write("SLOW", f"took={took:.2f}s query={query[:120]!r}")

    cursor.execute = traced_execute


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the backend once it is imported (Django imports it with
    importlib.import_module, which no __import__ hook sees)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != BACKEND:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
