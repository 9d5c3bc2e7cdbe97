"""``jobs audit``: the audit trail, newest first, or the entries naming one job."""

from __future__ import annotations

from typing import Any

from jobs.cli.console import table, when
from jobs.ledger import audit
from jobs.models import AuditEntry

NOTE_WIDTH = 50


def audit_report(limit: int, job: str | None) -> dict[str, Any]:
    entries = audit.naming(job, limit) if job else AuditEntry.objects.order_by("-id")[:limit]
    return {
        "entries": [
            {
                "at": e.at,
                "who": e.who,
                "source": e.source,
                "action": e.action,
                "target": e.target,
                "count": e.count,
                "note": e.note,
                "message_ids": e.message_ids.split(),
            }
            for e in entries
        ]
    }


def audit_text(report: dict[str, Any]) -> str:
    if not report["entries"]:
        return "No audit entries."
    return table(
        ("when", "who", "source", "action", "on", "jobs", "note"),
        [
            (
                when(e["at"]),
                e["who"],
                e["source"],
                e["action"],
                e["target"] or "-",
                e["count"],
                e["note"][:NOTE_WIDTH],
            )
            for e in report["entries"]
        ],
    )
