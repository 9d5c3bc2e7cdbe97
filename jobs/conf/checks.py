"""System checks of the platform's configuration (``manage.py check``, every command).

Each names the setting that is wrong and what to write instead, so a project
that forgot something sees one list of errors, not one traceback per restart.

- ``jobs.E002``: ``DRAMATIQ_BROKER`` is missing or is not the platform's broker.
- ``jobs.E003``: ``DRAMATIQ_BROKER["MIDDLEWARE"]`` lacks middleware the platform needs.
- ``jobs.E004``: ``JOBS_CACHE`` does not name a django-redis cache.
- ``jobs.E005``: a ``JOBS_*`` setting has a value of the wrong type, range or syntax.
- ``jobs.W002``: a setting whose name is close to a ``JOBS_*`` setting (a typo).
- ``jobs.W003``: migrations are not all applied, or cannot be checked (``--database``).
- ``jobs.W004``: the daily report or the watchdog is scheduled but no one gets its mail.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from periodiq import CronSpec, cron

from jobs.conf.broker import MIDDLEWARE
from jobs.conf.defaults import DEFAULTS, Knob

BROKER_HINT = (
    "In settings: from jobs.conf import dramatiq_broker; "
    'DRAMATIQ_BROKER = dramatiq_broker("redis://127.0.0.1:6379/0")'
)
CACHE_HINT = (
    "In settings: from jobs.conf import redis_cache; "
    'CACHES = {"default": redis_cache("redis://127.0.0.1:6379/1")} '
    "(or another alias, named by JOBS_CACHE)"
)
_BROKER_CLASS = "jobs.broker.wakeup.WakeupRedisBroker"
# Names the platform's settings had before they were packaged (0.1.0) under JOBS_.
RENAMED = {
    old: f"JOBS_{old}"
    for old in (
        "REPORT_CRON",
        "REPORT_CATCH_UP_HOURS",
        "WATCHDOG_CRON",
        "PRUNE_CRON",
        "WATCHDOG_GRACE_S",
        "WATCHDOG_LOCK_MAX_AGE_S",
        "WATCHDOG_QUEUE_STALL_MINUTES",
        "WATCHDOG_MAIL_EVERY_MINUTES",
        "METRICS_TOKEN",
        "METRICS_ALLOWED_IPS",
    )
}
# django-redis clients that spread keys over several servers: no lock(), no one client.
_UNLOCKABLE_CLIENTS = ("ShardClient",)
# Dramatiq's and django_dramatiq's versions of middleware the platform has its own of.
_DOUBLES = {
    "dramatiq.middleware.Retries",
    "dramatiq.middleware.retries.Retries",
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.time_limit.TimeLimit",
    "django_dramatiq.middleware.DbConnectionsMiddleware",
}
# (lowest, highest) of each cron field: minute, hour, day of month, month, weekday.
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_ITEM = re.compile(r"^(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?$")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_WEEKDAY = re.compile("|".join(_WEEKDAYS), re.IGNORECASE)


def check_broker(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.apps import BROKER_SETTING, BROKER_STAND_IN

    broker = getattr(settings, "DRAMATIQ_BROKER", None)
    if BROKER_STAND_IN or not isinstance(broker, dict):
        setting = BROKER_SETTING if BROKER_STAND_IN else broker
        found = "is not set" if setting is None else f"is malformed ({setting!r:.80})"
        return [
            Error(
                f"DRAMATIQ_BROKER {found}: django_dramatiq would connect to RabbitMQ on "
                "localhost, and the platform's middleware would be missing.",
                hint=BROKER_HINT,
                id="jobs.E002",
            )
        ]
    if not _is_our_broker(str(broker.get("BROKER"))):
        return [
            Error(
                f"DRAMATIQ_BROKER['BROKER'] is {broker['BROKER']!r}; the platform needs "
                f"{_BROKER_CLASS!r} or a subclass (held acks, instant wake-up, the ledger's "
                "order).",
                hint=BROKER_HINT,
                id="jobs.E002",
            )
        ]
    return _middleware_problems([m for m in broker.get("MIDDLEWARE", []) if isinstance(m, str)])


def _is_our_broker(path: str) -> bool:
    from django.utils.module_loading import import_string

    from jobs.broker.wakeup import WakeupRedisBroker

    try:
        found = import_string(path)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, WakeupRedisBroker)


def _middleware_problems(listed: list[str]) -> list[CheckMessage]:
    hint = "Build it with jobs.conf.dramatiq_broker(url, extra_middleware=[...])."
    missing = [m for m in MIDDLEWARE if m not in listed]
    if missing:
        return [
            Error(
                "DRAMATIQ_BROKER['MIDDLEWARE'] lacks " + ", ".join(missing) + ": a list there "
                "replaces Dramatiq's defaults, so their behaviour is silently gone.",
                hint=hint,
                id="jobs.E003",
            )
        ]
    doubles = [m for m in listed if m in _DOUBLES]
    if doubles:
        return [
            Error(
                "DRAMATIQ_BROKER['MIDDLEWARE'] lists " + ", ".join(doubles) + " beside the "
                "platform's own (retries, time limits, connections): both would act on "
                "every job.",
                hint=hint,
                id="jobs.E003",
            )
        ]
    ours = [m for m in listed if m in MIDDLEWARE]
    if ours != list(MIDDLEWARE):
        return [
            Error(
                "DRAMATIQ_BROKER['MIDDLEWARE'] lists the platform's middleware out of "
                "order: Dramatiq runs them in list order, and each relies on the ones "
                "before it.",
                hint=hint,
                id="jobs.E003",
            )
        ]
    return []


def check_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.conf import jobs_settings

    alias = jobs_settings.JOBS_CACHE
    caches = getattr(settings, "CACHES", {})
    if not isinstance(alias, str) or not isinstance(caches, dict):
        return []  # jobs.E005 names a JOBS_CACHE that is not a string; Django's, CACHES
    if alias not in caches:
        return [
            Error(
                f"JOBS_CACHE names the cache {alias!r}, which CACHES does not define.",
                hint=CACHE_HINT,
                id="jobs.E004",
            )
        ]
    entry = caches[alias] if isinstance(caches[alias], dict) else {}
    backend = str(entry.get("BACKEND", ""))
    client = str((entry.get("OPTIONS") or {}).get("CLIENT_CLASS", ""))
    if client.endswith(_UNLOCKABLE_CLIENTS):
        return [
            Error(
                f"CACHES[{alias!r}] uses django-redis's {client.rpartition('.')[2]}, which "
                "cannot hold a lock on one server (the platform's locks, rate limits and "
                "dedup keys need one).",
                hint=CACHE_HINT,
                id="jobs.E004",
            )
        ]
    if not backend.startswith("django_redis."):
        return [
            Error(
                f"CACHES[{alias!r}] uses {backend!r}; the platform's locks, rate limits and "
                "dedup keys need django-redis's RedisCache.",
                hint=CACHE_HINT,
                id="jobs.E004",
            )
        ]
    return []


def check_values(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for name, knob in DEFAULTS.items():
        if hasattr(settings, name):
            problem = _problem(knob, getattr(settings, name))
            if problem:
                errors.append(Error(f"{name} {problem}.", id="jobs.E005"))
    return errors


def check_names(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    warnings: list[CheckMessage] = []
    for name in dir(settings):
        if name in DEFAULTS or not name.isupper():
            continue
        meant = RENAMED.get(name)
        if meant is None and name.startswith(("JOBS_", "JOB_")):
            close = difflib.get_close_matches(name, DEFAULTS, n=1, cutoff=0.85)
            meant = close[0] if close else None
        if meant is not None:
            warnings.append(
                Warning(
                    f"{name} is not a setting of the jobs platform.",
                    hint=f"Did you mean {meant}?",
                    id="jobs.W002",
                )
            )
    return warnings


def _of_kind(value: object, kinds: tuple[type, ...]) -> bool:
    # bool is an int in Python; a True where a number belongs is a mistake.
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _problem(knob: Knob, value: Any) -> str | None:
    kinds = knob.kind if isinstance(knob.kind, tuple) else (knob.kind,)
    if not _of_kind(value, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        return f"must be {names}, got {value!r}"
    if knob.minimum is not None and value < knob.minimum:
        return f"must be at least {knob.minimum}, got {value!r}"
    if knob.parse == "tz":
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            return f"is not a time zone name, got {value!r}"
    if knob.parse == "cron":
        return cron_problem(value)
    if knob.parse == "networks":
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except (TypeError, ValueError):
                return f"has an entry that is not an address or network: {entry!r}"
    if knob.kind == (tuple, list) and not all(isinstance(item, str) for item in value):
        return f"must hold strings, got {value!r}"
    unknown = [item for item in value if item not in knob.choices] if knob.choices else []
    if unknown:
        return f"holds {unknown!r}; it may hold {', '.join(knob.choices)}"
    return None


def cron_problem(spec: object) -> str | None:
    """Why ``spec`` is not a cron expression periodiq can run, or None.

    periodiq's own parser accepts some specs it then fails on (``*/0``, ``5-1``)
    and crashes on others with an ``IndexError``: the fields are checked here
    first, then periodiq must parse what is left.
    """
    if not isinstance(spec, str):
        return f"must be a cron expression string, got {spec!r}"
    text = spec.strip()
    if text.startswith("@"):
        named = CronSpec._named_spec.get(text)
        if named is None:
            return f"is not a name periodiq knows ({', '.join(CronSpec._named_spec)}): {spec!r}"
        text = named
    fields = text.split()
    if len(fields) != 5:
        return f"must have 5 fields (minute hour day month weekday), got {spec!r}"
    fields[4] = _WEEKDAY.sub(lambda day: str(_WEEKDAYS.index(day.group(0).lower())), fields[4])
    for field, (low, high), what in zip(
        fields, _CRON_RANGES, ("minute", "hour", "day", "month", "weekday"), strict=True
    ):
        for item in field.split(","):
            match = _CRON_ITEM.match(item)
            if not match:
                return f"has a {what} field periodiq cannot read: {field!r} in {spec!r}"
            start, end, step = match.group(2), match.group(3), match.group(4)
            numbers = [int(n) for n in (start, end) if n is not None]
            if any(not low <= n <= high for n in numbers):
                return f"has a {what} out of range {low}-{high}: {field!r} in {spec!r}"
            if len(numbers) == 2 and numbers[0] > numbers[1]:
                return f"has a {what} range that runs backwards: {field!r} in {spec!r}"
            if step is not None and int(step) < 1:
                return f"has a {what} step of 0: {field!r} in {spec!r}"
    if fields[2] != "*" and fields[4] == "*" and not _some_day_exists(fields[2], fields[3]):
        # periodiq accepts 0 0 31 4 * and shows a next run, but never runs it
        return f"names a day no month of it has (never runs): {spec!r}"
    try:
        cron(spec)
    except Exception as exc:  # periodiq's parser raises whatever it meets
        return f"cannot be read by periodiq ({type(exc).__name__}: {exc}): {spec!r}"
    return None


_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # a leap year's


def _expand(field: str, low: int, high: int) -> set[int]:
    """The numbers a checked cron field names."""
    found: set[int] = set()
    for item in field.split(","):
        match = _CRON_ITEM.match(item)
        assert match is not None  # checked before
        start = low if match.group(1) == "*" else int(match.group(2))
        end = high if match.group(1) == "*" else int(match.group(3) or start)
        if match.group(1) != "*" and match.group(3) is None and match.group(4):
            end = high  # "5/15": from 5 on
        found.update(range(start, end + 1, int(match.group(4) or 1)))
    return found


def _some_day_exists(days: str, months: str) -> bool:
    return any(
        day <= _DAYS_IN_MONTH[month - 1]
        for day in _expand(days, 1, 31)
        for month in _expand(months, 1, 12)
    )


def check_recipients(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.conf import jobs_settings

    periodic = jobs_settings.JOBS_PERIODIC
    mailing = {"daily_report", "watchdog"} & set(
        periodic if isinstance(periodic, (list, tuple)) else ()
    )
    if mailing and not jobs_settings.JOBS_MAIL_RECIPIENTS:
        return [
            Warning(
                f"{' and '.join(sorted(mailing))} will run but mail no one: "
                "JOBS_MAIL_RECIPIENTS and ADMINS are empty.",
                hint="Set JOBS_MAIL_RECIPIENTS = ['ops@example.com'], or leave the jobs "
                "out of JOBS_PERIODIC.",
                id="jobs.W004",
            )
        ]
    return []
