"""Figures for the admin dashboard: queues from Redis, outcomes and charts from the ledger."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils.safestring import SafeString

from jobs.admin import charts
from jobs.broker import queues, redis_broker
from jobs.concurrency import slots
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger.figures import (
    LAST_DAY,
    LAST_HOUR,
    OUTCOMES,
    Timeline,
    failure_rate,
    state_counts,
    stuck_running,
    timeline,
)
from jobs.models import Job

# A failure rate at or above this is flagged on the dashboard.
FAILURE_RATE_ALARM = 0.10
# Tick labels: every 10th minute of the hour, every 3rd hour of the day.
TICK_EVERY = {"minute": 10, "hour": 3}


def timeline_charts(line: Timeline) -> tuple[SafeString, SafeString]:
    unit = line.window.unit
    labels = [start.strftime("%H:%M") for start in line.starts]
    outcomes = [charts.Series(o, line.outcomes[o], f"s-{o}") for o in OUTCOMES]
    durations = [
        charts.Series(actor, values, f"s-{i % 6}")
        for i, (actor, values) in enumerate(line.p95_ms.items())
    ]
    every = TICK_EVERY[unit]
    return (
        charts.stacked_bars(
            f"finished-per-{unit}",
            f"Jobs finished per {unit}, {line.window.label.split(',')[0].lower()} (UTC)",
            labels,
            outcomes,
            every=every,
        ),
        charts.lines(
            f"p95-per-{unit}",
            f"p95 duration per actor, per {unit}",
            labels,
            durations,
            every=every,
            unit="ms",
        ),
    )


def _queue_stats() -> tuple[list[Any], str]:
    """The queues' live figures, or why there are none (Redis unreachable)."""
    if recently_unreachable():
        return [], "Redis did not answer a moment ago; queue figures are not shown."
    try:
        return list(queues.all_queue_stats()), ""
    except UNREACHABLE as exc:
        note_unreachable(exc)
        return [], f"Redis is unreachable ({type(exc).__name__}); queue figures are not shown."


def _busiest_keys() -> list[slots.KeyLoad]:
    """The concurrency keys with the most jobs waiting for a slot (none when Redis
    did not answer: the queue table says so already)."""
    if recently_unreachable():
        return []
    broker = redis_broker()
    try:
        return slots.busiest(broker.client, broker.namespace)
    except UNREACHABLE as exc:
        note_unreachable(exc)
        return []


def dashboard_context() -> dict[str, Any]:
    hour, day = state_counts(timedelta(hours=1)), state_counts(timedelta(days=1))
    queue_stats, queues_error = _queue_stats()
    busiest_keys = _busiest_keys() if not queues_error else []
    # The actor table sums the day chart's hourly buckets (cached once settled):
    # no query per actor, and the same window and duration classes as the chart.
    hour_line, day_line = timeline(LAST_HOUR), timeline(LAST_DAY)
    return {
        "queues": queue_stats,
        "queues_error": queues_error,
        "busiest_keys": busiest_keys,
        "states": Job.State.values,
        "counts": [("Last hour", hour, failure_rate(hour)), ("Last day", day, failure_rate(day))],
        "charts": [timeline_charts(hour_line), timeline_charts(day_line)],
        "actors": day_line.actors,
        "actors_since": day_line.starts[0].strftime("%H:%M"),
        "stuck": stuck_running().count(),
        "failure_rate_alarm": FAILURE_RATE_ALARM,
    }
