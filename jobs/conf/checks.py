"""System checks of the platform's configuration (``manage.py check``, every command).

Each names the setting that is wrong and what to write instead, so a project
that forgot something sees one list of errors, not one traceback per restart.

- ``jobs.E002``: ``DRAMATIQ_BROKER`` is missing or is not the platform's broker.
- ``jobs.E003``: ``DRAMATIQ_BROKER["MIDDLEWARE"]`` lacks middleware the platform needs.
- ``jobs.E004``: ``JOBS_CACHE`` does not name a django-redis cache.
- ``jobs.E005``: a ``JOBS_*`` setting has a value of the wrong type, range or syntax.
- ``jobs.W002``: a setting whose name is close to a ``JOBS_*`` setting (a typo).
- ``jobs.W003``: the platform's migrations are not all applied (``--database``).
- ``jobs.W004``: the daily report or the watchdog is scheduled but no one gets its mail.
"""

from __future__ import annotations

import difflib
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

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
_BROKER_CLASSES = ("jobs.broker.wakeup.WakeupRedisBroker",)
# (lowest, highest) of each cron field: minute, hour, day of month, month, weekday.
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_ITEM = re.compile(r"^(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?$")


def check_broker(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.apps import BROKER_STAND_IN

    broker = getattr(settings, "DRAMATIQ_BROKER", None)
    if not isinstance(broker, dict) or BROKER_STAND_IN:
        return [
            Error(
                "DRAMATIQ_BROKER is not set: django_dramatiq would connect to RabbitMQ "
                "on localhost, and the platform's middleware would be missing.",
                hint=BROKER_HINT,
                id="jobs.E002",
            )
        ]
    if broker.get("BROKER") not in _BROKER_CLASSES:
        return [
            Error(
                f"DRAMATIQ_BROKER['BROKER'] is {broker.get('BROKER')!r}; the platform needs "
                f"{_BROKER_CLASSES[0]!r} (held acks, instant wake-up, the ledger's order).",
                hint=BROKER_HINT,
                id="jobs.E002",
            )
        ]
    listed = [m for m in broker.get("MIDDLEWARE", []) if isinstance(m, str)]
    missing = [m for m in MIDDLEWARE if m not in listed]
    if missing:
        return [
            Error(
                "DRAMATIQ_BROKER['MIDDLEWARE'] lacks " + ", ".join(missing) + ": a list there "
                "replaces Dramatiq's defaults, so their behaviour is silently gone.",
                hint="Build it with jobs.conf.dramatiq_broker(url, extra_middleware=[...]).",
                id="jobs.E003",
            )
        ]
    return []


def check_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.conf import jobs_settings

    alias = jobs_settings.JOBS_CACHE
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [
            Error(
                f"JOBS_CACHE names the cache {alias!r}, which CACHES does not define.",
                hint=CACHE_HINT,
                id="jobs.E004",
            )
        ]
    backend = str(caches[alias].get("BACKEND", ""))
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
        if not name.startswith("JOBS_") or name in DEFAULTS:
            continue
        close = difflib.get_close_matches(name, DEFAULTS, n=1, cutoff=0.85)
        if close:
            warnings.append(
                Warning(
                    f"{name} is not a setting of the jobs platform.",
                    hint=f"Did you mean {close[0]}?",
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
    if knob.kind == (tuple, list) and not all(isinstance(item, str) for item in value):
        return f"must hold strings, got {value!r}"
    unknown = [item for item in value if item not in knob.choices] if knob.choices else []
    if unknown:
        return f"holds {unknown!r}; it may hold {', '.join(knob.choices)}"
    return None


def cron_problem(spec: str) -> str | None:
    """Why ``spec`` is not a five-field cron expression periodiq can run, or None."""
    fields = spec.split()
    if len(fields) != 5:
        return f"must have 5 fields (minute hour day month weekday), got {spec!r}"
    for field, (low, high), what in zip(
        fields, _CRON_RANGES, ("minute", "hour", "day", "month", "weekday"), strict=True
    ):
        for item in field.split(","):
            match = _CRON_ITEM.match(item)
            if not match:
                return f"has a {what} field periodiq cannot read: {field!r} in {spec!r}"
            start, end, step = match.group(2), match.group(3), match.group(4)
            numbers = [int(n) for n in (start, end) if n is not None]
            if any(not low <= n <= high for n in numbers) or (step is not None and int(step) < 1):
                return f"has a {what} out of range {low}-{high}: {field!r} in {spec!r}"
    return None


def check_recipients(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from jobs.conf import jobs_settings

    mailing = {"daily_report", "watchdog"} & set(jobs_settings.JOBS_PERIODIC)
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
