"""Read-side figures of the job ledger: outcomes per state and per actor.

Shared by the admin dashboard and the daily report, so both count the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone

from jobs.ledger import states
from jobs.models import Job

SAMPLE = 5_000  # durations per actor used for the percentiles


@dataclass(frozen=True)
class ActorFigures:
    actor: str
    finished: int
    failed: int
    p50_ms: float | None
    p95_ms: float | None

    @property
    def failure_rate(self) -> float | None:
        return None if not self.finished else self.failed / self.finished


def state_counts(since: timedelta) -> dict[str, int]:
    rows = (
        Job.objects.filter(enqueued_at__gte=timezone.now() - since)
        .values("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = {state: 0 for state in Job.State.values}
    counts.update({row["state"]: row["n"] for row in rows})
    return counts


def failure_rate(counts: dict[str, int]) -> float | None:
    finished = counts[states.SUCCEEDED] + counts[states.FAILED]
    return None if not finished else counts[states.FAILED] / finished


def actor_figures(start: datetime, end: datetime | None = None) -> list[ActorFigures]:
    """Per actor: jobs finished in [start, end), failures, p50/p95 duration."""
    finished = Job.objects.filter(
        state__in=(states.SUCCEEDED, states.FAILED), finished_at__gte=start
    )
    if end is not None:
        finished = finished.filter(finished_at__lt=end)
    figures = []
    totals = finished.values("actor_name", "state").annotate(n=Count("id")).order_by()
    by_actor: dict[str, dict[str, int]] = {}
    for row in totals:
        by_actor.setdefault(row["actor_name"], {})[row["state"]] = row["n"]
    for actor, counts in sorted(by_actor.items()):
        durations: list[float] = sorted(
            float(d)
            for d in finished.filter(actor_name=actor, duration_ms__isnull=False)
            .order_by("-finished_at")
            .values_list("duration_ms", flat=True)[:SAMPLE]
            if d is not None
        )
        p50: float | None = None
        p95: float | None = None
        if len(durations) >= 2:
            cuts = statistics.quantiles(durations, n=100, method="inclusive")
            p50, p95 = cuts[49], cuts[94]
        elif durations:
            p50 = p95 = durations[0]
        figures.append(
            ActorFigures(
                actor,
                sum(counts.values()),
                counts.get(states.FAILED, 0),
                p50,
                p95,
            )
        )
    return figures
