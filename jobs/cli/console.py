"""How the command speaks: its result on stdout (text, or one JSON document and
nothing else), questions and progress on stderr, one audit line per run."""

from __future__ import annotations

import getpass
import json
import logging
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from django.core.management.base import CommandError, OutputWrapper
from django.utils import timezone

from jobs.cli import EXIT_USAGE
from jobs.ledger import audit as trail

audit_logger = logging.getLogger("jobs.audit")


def operator() -> str:
    """The operating-system user running the command: who did it, for the audit line."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # a container's uid with no name
        return f"uid:{os.getuid()}"


def audit(
    action: str,
    *,
    target: dict[str, Any],
    count: int,
    outcome: str = "done",
    message_ids: Sequence[str] | None = None,
) -> None:
    """One line per run on logger ``jobs.audit``: who, what, on which jobs, how many.

    The fields also go as record attributes (``audit_*``), so the JSON log format
    carries them as fields a log search can filter on. A run that changed
    something (``message_ids`` given, even empty) is also an ``AuditEntry``,
    shown in the admin beside the admin's own actions.
    """
    user = operator()
    if message_ids is not None:
        trail.record(
            action,
            who=f"os:{user}",
            source="cli",
            target=json.dumps(target, sort_keys=True),
            message_ids=message_ids,
            count=count,
            note=outcome,
        )
    audit_logger.info(
        "jobs %s by %s: %s, count %d, %s",
        action,
        user,
        json.dumps(target, sort_keys=True),
        count,
        outcome,
        extra={
            "audit_user": user,
            "audit_action": action,
            "audit_outcome": outcome,
            "audit_target": target,
            "audit_count": count,
        },
    )


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, default=_plain, ensure_ascii=False)


def when(value: datetime | None) -> str:
    """A time for a terminal, with seconds: the admin's lack of them was a complaint."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(isinstance(r[i], int) for r in rows) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if numeric[i] else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


class Console:
    def __init__(
        self,
        stdout: OutputWrapper,
        stderr: OutputWrapper,
        *,
        json_mode: bool,
        verbosity: int,
        stdin: TextIO,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.json_mode = json_mode
        self.verbosity = verbosity
        self.stdin = stdin

    def result(self, document: dict[str, Any], text: str) -> None:
        self.stdout.write(to_json(document) if self.json_mode else text)

    def note(self, text: str) -> None:
        """A line for the operator watching (progress, warnings): never on stdout."""
        if self.verbosity >= 1:
            self.stderr.write(text)

    def can_ask(self) -> None:
        """Refuse to go on when there is no terminal to ask: without one (a pipe,
        cron, CI) a question would hang or read garbage, so the caller must have
        said ``--yes``."""
        if not self.stdin.isatty():
            raise CommandError(
                "stdin is not a terminal, so there is no one to confirm: "
                "pass --yes to act without asking (or --dry-run to count only)",
                returncode=EXIT_USAGE,
            )

    def confirm(self, question: str) -> bool:
        self.can_ask()
        self.stderr.write(f"{question} [y/N] ", ending="")
        self.stderr.flush()
        return self.stdin.readline().strip().lower() in ("y", "yes")
