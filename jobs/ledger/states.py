"""Job states, importable before Django's app registry is ready (by middleware)."""

from __future__ import annotations

ENQUEUED = "enqueued"
DELAYED = "delayed"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
SKIPPED = "skipped"
CANCELLED = "cancelled"

TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, SKIPPED, CANCELLED})
