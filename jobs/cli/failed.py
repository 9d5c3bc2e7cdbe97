"""``jobs failed``, and which failures were permanent (failed for good)."""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

from django.db.models import F, QuerySet

from jobs.cli.console import table, when
from jobs.cli.selection import Selection
from jobs.errors import PermanentJobError
from jobs.ledger import states
from jobs.models import Job

ERROR_WIDTH = 60  # characters of the error shown per row in text; --json has it all


@cache
def is_permanent(error_class_path: str) -> bool:
    """Whether the ledger's ``error_class_path`` names a ``PermanentJobError``
    (``InvalidPayload`` is one): the Retries middleware failed the job at once,
    and retrying it unchanged fails again.

    Read from modules already imported, never by importing what a database row
    names: the process has imported every app's ``tasks`` module and the
    platform's middleware, where job errors are raised from. An unknown class
    counts as not permanent, as the worker would have treated it.
    """
    parts = error_class_path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # nested classes have dots in their name
        found: Any = sys.modules.get(".".join(parts[:cut]))
        if found is None:
            continue
        for name in parts[cut:]:
            found = getattr(found, name, None)
        return isinstance(found, type) and issubclass(found, PermanentJobError)
    return False


def permanent_paths(failed: QuerySet[Job]) -> list[str]:
    """The permanent error classes among ``failed``: one DISTINCT over a few
    names, so the jobs are then told apart in SQL, not one by one."""
    paths = (
        failed.exclude(error_class_path="")
        .order_by()
        .values_list("error_class_path", flat=True)
        .distinct()
    )
    return sorted(path for path in paths if is_permanent(path))


def failed_report(selection: Selection, limit: int) -> dict[str, Any]:
    failed = selection.jobs((states.FAILED,))
    rows = failed.order_by(F("finished_at").desc(nulls_last=True), "-id").values(
        "id",
        "message_id",
        "actor_name",
        "queue_name",
        "attempts",
        "max_attempts",
        "finished_at",
        "error_type",
        "error_class_path",
        "error_message",
        "retried_as",
    )[:limit]
    return {
        "total": failed.count(),
        "jobs": [
            {
                "id": row["id"],
                "message_id": row["message_id"],
                "actor": row["actor_name"],
                "queue": row["queue_name"],
                "attempts": row["attempts"],
                "max_attempts": row["max_attempts"],
                "finished_at": row["finished_at"],
                "error_type": row["error_type"],
                "error_message": row["error_message"],
                "permanent": is_permanent(row["error_class_path"]),
                "retried_as": row["retried_as"],
            }
            for row in rows
        ],
    }


def _error(job: dict[str, Any]) -> str:
    first_line = (job["error_message"].splitlines() or [""])[0]
    text = f"{job['error_type']}: {first_line}" if first_line else job["error_type"]
    return text if len(text) <= ERROR_WIDTH else text[: ERROR_WIDTH - 3] + "..."


def _note(job: dict[str, Any]) -> str:
    notes = ["failed for good"] if job["permanent"] else []
    notes += ["retried"] if job["retried_as"] else []
    return ", ".join(notes)


def failed_text(report: dict[str, Any]) -> str:
    jobs = report["jobs"]
    if not jobs:
        return "No failed job matches."
    rows = [
        (
            j["id"],
            j["message_id"],
            j["actor"],
            j["queue"],
            f"{j['attempts']} of {j['max_attempts']}",
            when(j["finished_at"]),
            _error(j),
            _note(j),
        )
        for j in jobs
    ]
    headers = ("ID", "MESSAGE ID", "ACTOR", "QUEUE", "ATTEMPTS", "FINISHED", "ERROR", "NOTE")
    shown = f"{len(jobs)} of {report['total']:,} failed job(s), newest first"
    return f"{table(headers, rows)}\n{shown}"
