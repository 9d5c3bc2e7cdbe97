"""Read-side figures of the job ledger: outcomes per state and per actor, timelines.

Shared by the admin dashboard and the daily report, so both count the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import caches
from django.db.models import Case, CharField, Count, Func, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from jobs.conf import jobs_settings
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger import states
from jobs.models import Job
from jobs.observability.metrics import DURATION_BUCKETS

SAMPLE = 5_000  # durations per actor used for the report's percentiles


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
        # Naming every state turns the scan into one range per state of
        # jobs_job_state_enqueued, already grouped: no table reads, no sort.
        # COUNT(*), not COUNT(id): PostgreSQL's index has no id (SQLite's has
        # the rowid), and counting it would read the table after all.
        Job.objects.filter(state__in=Job.State.values, enqueued_at__gte=timezone.now() - since)
        .values("state")
        .annotate(n=Count("*"))
        .order_by()
    )
    counts = {state: 0 for state in Job.State.values}
    counts.update({row["state"]: row["n"] for row in rows})
    return counts


def failure_rate(counts: dict[str, int]) -> float | None:
    finished = counts[states.SUCCEEDED] + counts[states.FAILED]
    return None if not finished else counts[states.FAILED] / finished


def actor_figures(start: datetime, end: datetime | None = None) -> list[ActorFigures]:
    """Per actor: jobs finished in [start, end), failures, p50/p95 of its newest
    durations (the daily report's exact figures; one query per actor, so the
    dashboard takes its table from the day chart's buckets, ``Timeline.actors``)."""
    finished = Job.objects.filter(
        state__in=(states.SUCCEEDED, states.FAILED), finished_at__gte=start
    )
    if end is not None:
        finished = finished.filter(finished_at__lt=end)
    figures = []
    # COUNT(*): jobs_job_finished_cover holds no id (see state_counts).
    totals = finished.values("actor_name", "state").annotate(n=Count("*")).order_by()
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


def stuck_running() -> QuerySet[Job]:
    """Jobs recorded as running for longer than the default time limit plus the
    watchdog's grace: stuck, or their end was never recorded."""
    limit = timedelta(
        milliseconds=jobs_settings.JOBS_TIME_LIMIT_MS, seconds=jobs_settings.JOBS_WATCHDOG_GRACE_S
    )
    return Job.objects.filter(state=states.RUNNING, started_at__lt=timezone.now() - limit)


# --- timelines (the dashboard's charts) ---------------------------------------

# The chart series: "retried" are jobs that succeeded after a failed attempt.
OUTCOMES = ("succeeded", "retried", "failed", "skipped", "cancelled")
# Upper bounds of the duration classes, the same as jobs_duration_seconds', so
# the admin's p95 and Grafana's histogram_quantile agree.
BOUNDS_MS = tuple(int(bound * 1000) for bound in DURATION_BUCKETS)


class TimeBucket(Func):
    """The UTC minute or hour a datetime falls in, as text: ``2026-11-30 08:57``.

    Django's ``TruncMinute`` calls back into Python for every row on SQLite; these
    expressions are native on SQLite (datetimes are stored as UTC text there) and
    PostgreSQL, so grouping a day of jobs stays inside the index scan.
    """

    output_field = CharField()
    FORMATS = {"minute": (16, "YYYY-MM-DD HH24:MI"), "hour": (13, "YYYY-MM-DD HH24")}

    def __init__(self, expression: str, unit: str) -> None:
        self.length, pattern = self.FORMATS[unit]
        super().__init__(expression)
        # PostgreSQL; SQLite below
        self.template = f"to_char(%(expressions)s AT TIME ZONE 'UTC', '{pattern}')"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        template = f"substr(%(expressions)s, 1, {self.length})"
        return super().as_sql(compiler, connection, template=template, **extra)


@dataclass(frozen=True)
class Window:
    label: str
    unit: str  # "minute" or "hour"
    step: timedelta
    buckets: int

    def starts(self, now: datetime) -> list[datetime]:
        """Bucket starts, oldest first; the last bucket is the current one."""
        floor = now.astimezone(UTC).replace(second=0, microsecond=0)
        if self.unit == "hour":
            floor = floor.replace(minute=0)
        return [floor - self.step * i for i in range(self.buckets - 1, -1, -1)]


LAST_HOUR = Window("Last hour, per minute", "minute", timedelta(minutes=1), 60)
LAST_DAY = Window("Last day, per hour", "hour", timedelta(hours=1), 24)


@dataclass
class Timeline:
    window: Window
    starts: list[datetime]
    outcomes: dict[str, list[int]]  # outcome -> jobs finished per bucket
    p95_ms: dict[str, list[float | None]] = field(default_factory=dict)  # actor -> per bucket
    # Per actor over the whole window, from the same buckets as the charts.
    actors: list[ActorFigures] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        return {outcome: sum(counts) for outcome, counts in self.outcomes.items()}


def quantile_from_counts(counts: dict[int, int], q: float) -> float | None:
    """The q-quantile of durations counted per class, interpolated inside the class.

    Class i holds durations up to ``BOUNDS_MS[i]``; the last class (above every
    bound) reports the highest bound, as Prometheus' ``histogram_quantile`` does.
    """
    total = sum(counts.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for index in range(len(BOUNDS_MS) + 1):
        in_class = counts.get(index, 0)
        if in_class and seen + in_class >= rank:
            if index == len(BOUNDS_MS):
                return float(BOUNDS_MS[-1])
            lower = BOUNDS_MS[index - 1] if index else 0
            return lower + (BOUNDS_MS[index] - lower) * (rank - seen) / in_class
        seen += in_class
    return float(BOUNDS_MS[-1])


def _duration_class() -> Case:
    whens = [When(duration_ms__isnull=True, then=Value(-1))]
    whens += [When(duration_ms__lte=bound, then=Value(i)) for i, bound in enumerate(BOUNDS_MS)]
    return Case(*whens, default=Value(len(BOUNDS_MS)), output_field=IntegerField())


@dataclass
class Bucket:
    """What finished in one minute or hour: jobs per outcome; per actor, jobs per
    state and duration classes."""

    outcomes: dict[str, int] = field(default_factory=dict)
    actors: dict[str, dict[str, int]] = field(default_factory=dict)
    durations: dict[str, dict[int, int]] = field(default_factory=dict)


def _key(moment: datetime, unit: str) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")[: TimeBucket.FORMATS[unit][0]]


def chart_queryset(unit: str, start: datetime, end: datetime | None) -> Any:
    """Finished jobs grouped by bucket, state, retried, actor and duration class.

    Reads only ``jobs_job_finished_cover`` (state, finished_at, actor, duration,
    attempts), never the table, and returns at most buckets x states x actors x
    duration classes rows, whatever the ledger holds.
    """
    finished = Job.objects.filter(state__in=sorted(states.TERMINAL_STATES), finished_at__gte=start)
    if end is not None:
        finished = finished.filter(finished_at__lt=end)
    return (
        finished.annotate(
            bucket=TimeBucket("finished_at", unit),
            retried=Case(When(Q(attempts__gt=1), then=Value(1)), default=Value(0)),
            duration_class=_duration_class(),
        )
        .values_list("bucket", "state", "retried", "actor_name", "duration_class")
        .annotate(n=Count("*"))
        .order_by()
    )


def _aggregate(unit: str, start: datetime, end: datetime | None = None) -> dict[str, Bucket]:
    rows = chart_queryset(unit, start, end)
    buckets: dict[str, Bucket] = {}
    for key, state, retried, actor, duration_class, n in rows:
        bucket = buckets.setdefault(key, Bucket())
        outcome = "retried" if state == states.SUCCEEDED and retried else state
        bucket.outcomes[outcome] = bucket.outcomes.get(outcome, 0) + n
        per_state = bucket.actors.setdefault(actor, {})
        per_state[state] = per_state.get(state, 0) + n
        if duration_class >= 0:
            counts = bucket.durations.setdefault(actor, {})
            counts[duration_class] = counts.get(duration_class, 0) + n
    return buckets


# A finished hour is cached once late ledger writes (batched, or recorded by the
# watchdog) can no longer land in it; the day chart then only queries its
# current hour. The prefix names the Bucket's shape (v2: jobs per actor and
# state), so buckets cached in an older shape are never read as this one.
SETTLED_AFTER = timedelta(minutes=2)
CACHE_PREFIX = "jobs:timeline:hour:v2:"


def _hours(starts: list[datetime], now: datetime) -> dict[str, Bucket]:
    settled = [s for s in starts if s + timedelta(hours=1) + SETTLED_AFTER <= now]
    keys = {_key(s, "hour"): s for s in settled}
    cache = caches[jobs_settings.JOBS_CACHE]
    found: dict[str, Bucket] = {}
    # Settled hours come from the cache when Redis answers; without it the
    # dashboard computes them all from the database (slower, still right).
    if not recently_unreachable():
        try:
            stored = cache.get_many([CACHE_PREFIX + k for k in keys])
        except UNREACHABLE as exc:
            note_unreachable(exc)
            stored = {}
        found = {key[len(CACHE_PREFIX) :]: value for key, value in stored.items()}
    missing = [s for k, s in keys.items() if k not in found]
    if missing:
        fresh = _aggregate("hour", min(missing), max(missing) + timedelta(hours=1))
        computed = {_key(s, "hour"): fresh.get(_key(s, "hour"), Bucket()) for s in missing}
        if not recently_unreachable():
            try:
                cache.set_many({CACHE_PREFIX + k: v for k, v in computed.items()}, 25 * 3600)
            except UNREACHABLE as exc:
                note_unreachable(exc)
        found.update(computed)
    live_from = max(settled) + timedelta(hours=1) if settled else starts[0]
    found.update(_aggregate("hour", live_from))
    return found


def _actor_totals(
    per_state: dict[str, dict[str, int]], durations: dict[str, dict[int, int]]
) -> list[ActorFigures]:
    """Actors with jobs succeeded or failed; percentiles over their duration classes."""
    figures = []
    for actor, counts in sorted(per_state.items()):
        finished = counts.get(states.SUCCEEDED, 0) + counts.get(states.FAILED, 0)
        if finished:
            classes = durations.get(actor, {})
            figures.append(
                ActorFigures(
                    actor,
                    finished,
                    counts.get(states.FAILED, 0),
                    quantile_from_counts(classes, 0.5),
                    quantile_from_counts(classes, 0.95),
                )
            )
    return figures


def _add(into: dict[Any, int], counts: dict[Any, int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n


def timeline(window: Window, now: datetime | None = None, *, cached: bool = True) -> Timeline:
    """Jobs finished per bucket by outcome, the p95 duration per actor per bucket,
    and per actor its jobs, failures and p50/p95 over the whole window."""
    now = now or timezone.now()
    starts = window.starts(now)
    if window.unit == "hour" and cached:
        buckets = _hours(starts, now)
    else:
        buckets = _aggregate(window.unit, starts[0])
    outcomes = {outcome: [0] * len(starts) for outcome in OUTCOMES}
    histograms: dict[str, list[dict[int, int]]] = {}
    per_state: dict[str, dict[str, int]] = {}
    merged: dict[str, dict[int, int]] = {}
    for index, start in enumerate(starts):
        bucket = buckets.get(_key(start, window.unit))
        if bucket is None:
            continue
        for outcome, n in bucket.outcomes.items():
            outcomes[outcome][index] += n
        for actor, by_state in bucket.actors.items():
            _add(per_state.setdefault(actor, {}), by_state)
        for actor, counts in bucket.durations.items():
            histograms.setdefault(actor, [{} for _ in starts])[index] = counts
            _add(merged.setdefault(actor, {}), counts)
    p95 = {
        actor: [quantile_from_counts(counts, 0.95) for counts in per_bucket]
        for actor, per_bucket in sorted(histograms.items())
    }
    return Timeline(window, starts, outcomes, p95, _actor_totals(per_state, merged))
