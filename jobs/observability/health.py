"""``GET /healthz``: database (and its migrations), cache Redis and broker Redis, each
probed cheaply."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_redis import get_redis_connection
from redis.exceptions import ConnectionError as RedisConnectionError

from jobs.broker import redis_broker
from jobs.conf import jobs_settings
from jobs.conf.migrations import pending_migrations
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable

logger = logging.getLogger(__name__)


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _ping(client: Any) -> None:
    # After one Redis that did not answer, the other probe does not wait again.
    if recently_unreachable():
        raise RedisConnectionError("unreachable a moment ago")
    try:
        client.ping()
    except UNREACHABLE as exc:
        note_unreachable(exc)
        raise


def _redis() -> None:
    _ping(get_redis_connection(jobs_settings.JOBS_CACHE))


def _broker() -> None:
    _ping(redis_broker().client)


def _migrations() -> str | None:
    # Remembered once none is pending: a probe every few seconds costs nothing then.
    pending = pending_migrations()
    return f"pending: {len(pending)} unapplied" if pending else None


# Each check raises when its dependency is down, or returns what is wrong with it.
CHECKS: dict[str, Callable[[], str | None]] = {
    "database": _database,
    "migrations": _migrations,
    "redis": _redis,
    "broker": _broker,
}


def check_all() -> dict[str, str]:
    status: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            status[name] = check() or "ok"
        except Exception as exc:
            logger.warning("Health check %s failed: %s", name, exc)
            status[name] = f"down: {type(exc).__name__}"
    return status


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    status = check_all()
    healthy = all(value == "ok" for value in status.values())
    return JsonResponse(
        {"status": "ok" if healthy else "down", "checks": status}, status=200 if healthy else 503
    )
