"""The fault matrix: one row per fault test, printed at the end of the run.

A fault test reports what it counted from outside (jobs accepted, lost, run
twice, ledger rows left wrong, seconds to recover) with ``report(...)``; the
session's terminal summary prints them as one table, so every CI row shows the
matrix for the database it ran on. The rows are appended to a file in the
session's TEST_TMP_DIR, which worker subprocesses do not write to.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.db import connection

FILE = "fault-matrix.jsonl"


@dataclass(frozen=True)
class FaultRow:
    fault: str
    accepted: int
    lost: int
    twice: int | None  # effects run twice (an external effect in flight at a kill may be)
    wrong: int | None  # ledger rows left in a wrong state (None: not what this test reads)
    recover_s: float | None = None
    note: str = ""


def _path() -> Path:
    return Path(os.environ["TEST_TMP_DIR"]) / FILE


def report(row: FaultRow, database: str | None = None) -> None:
    """Add ``row`` to the matrix, under ``database`` (default: this process's)."""
    record = {**asdict(row), "database": database or connection.vendor}
    with _path().open("a") as out:
        out.write(json.dumps(record) + "\n")


def rows() -> list[dict[str, Any]]:
    path = _path()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(found: list[dict[str, Any]]) -> list[str]:
    headers = ("fault", "db", "accepted", "lost", "run twice", "rows wrong", "recovered", "note")
    cells = [
        (
            r["fault"],
            r["database"],
            str(r["accepted"]),
            str(r["lost"]),
            "-" if r["twice"] is None else str(r["twice"]),
            "-" if r["wrong"] is None else str(r["wrong"]),
            "-" if r["recover_s"] is None else f"{r['recover_s']:.1f} s",
            r["note"],
        )
        for r in found
    ]
    widths = [max(len(row[i]) for row in [headers, *cells]) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *cells]
    ]
