"""Figures for the admin dashboard: queues from Redis, outcomes from the ledger."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobs.broker import queues
from jobs.ledger.figures import actor_figures, failure_rate, state_counts
from jobs.models import Job


def dashboard_context() -> dict[str, Any]:
    hour, day = state_counts(timedelta(hours=1)), state_counts(timedelta(days=1))
    return {
        "queues": queues.all_queue_stats(),
        "states": Job.State.values,
        "counts": [("Last hour", hour, failure_rate(hour)), ("Last day", day, failure_rate(day))],
        "actors": actor_figures(timezone.now() - timedelta(days=1)),
    }
