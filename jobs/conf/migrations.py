"""Unapplied migrations (of any app): a worker, the scheduler and ``/healthz`` refuse
to pretend.

Without this, a worker on a database whose migrations are pending runs jobs
whose ledger writes fail one batch at a time (the admin shows no jobs), and
``/healthz`` answers 200 while signup answers 500.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.checks import CheckMessage, Warning
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

_applied: set[str] = set()


def pending_migrations(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """``app.name`` of every migration not applied to database ``using``.

    Once none is pending the answer is remembered: migrations are added by a
    deploy, which restarts the process. Raises what the database raises.
    """
    if using in _applied:
        return []
    executor = MigrationExecutor(connections[using])
    targets = executor.loader.graph.leaf_nodes()
    pending = [f"{m.app_label}.{m.name}" for m, _ in executor.migration_plan(targets)]
    if not pending:
        _applied.add(using)
    return pending


def refusal(pending: list[str]) -> str:
    """The one line a process prints when it will not start."""
    shown = ", ".join(pending[:3]) + (f" and {len(pending) - 3} more" if len(pending) > 3 else "")
    return (
        f"{len(pending)} unapplied migration(s) ({shown}): "
        "run `python manage.py migrate` first, then start this process again."
    )


def check_migrations(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # Tagged "database": runs with `check --database default`, and in `migrate`,
    # where it would tell the person running migrate to run migrate.
    if sys.argv[1:2] == ["migrate"]:
        return []
    warnings: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        try:
            pending = pending_migrations(alias)
        except DatabaseError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            warnings.append(
                Warning(
                    f"Could not check for unapplied migrations: {first}", obj=alias, id="jobs.W003"
                )
            )
            continue
        if pending:
            warnings.append(Warning(refusal(pending), obj=alias, id="jobs.W003"))
    return warnings
