"""Per-actor rate limits on Dramatiq's Redis-backed rate limiters.

    @dramatiq.actor(queue_name="emails")
    @rate_limited("welcome-email", limit=lambda: settings.WELCOME_EMAIL_RATE_PER_SECOND)
    def send_welcome_email(user_id: int) -> None: ...

At most ``limit`` runs start per ``window`` seconds, counted in Redis so every
worker process shares the budget (Dramatiq's ``WindowRateLimiter``). A job over
the limit is not failed: it raises ``RateLimited`` (a ``dramatiq.Retry``) with a
delay to the next window plus jitter, and that deferral does not use up one of
the job's retries, so a long burst never exhausts them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

import dramatiq
from django_redis import get_redis_connection
from dramatiq.middleware import CurrentMessage
from dramatiq.rate_limits import WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

DEFERRALS = "rate_limit_deferrals"


class RateLimited(dramatiq.Retry):
    """Over the rate limit: run again after ``delay`` ms."""


def _delay_ms(window: int) -> int:
    # Windows are whole wall-clock seconds; spread the retries over the next
    # window so the deferred jobs do not all come back at its first millisecond.
    now_ms = int(time.time() * 1000)
    return window * 1000 - now_ms % 1000 + random.randint(0, 1000 * window)


def _defer(key: str, window: int) -> RateLimited:
    message = CurrentMessage.get_current_message()
    if message is not None:
        # Retries counts every Retry against max_retries; a deferral is not a
        # failed attempt, so give the count back before Retries takes it.
        message.options["retries"] = message.options.get("retries", 0) - 1
        message.options[DEFERRALS] = message.options.get(DEFERRALS, 0) + 1
    delay = _delay_ms(window)
    logger.debug("Rate limit %s reached; deferred by %d ms", key, delay)
    return RateLimited(f"rate limit {key!r} reached", delay=delay)


def rate_limited(
    key: str, *, limit: int | Callable[[], int], window: int = 1
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Allow ``limit`` runs per ``window`` seconds; ``limit`` may be read at each call."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            limiter = WindowRateLimiter(  # type: ignore[no-untyped-call]
                RedisBackend(client=get_redis_connection("default")),
                f"ratelimit:actor:{key}",
                limit=limit() if callable(limit) else limit,
                window=window,
            )
            with limiter.acquire(raise_on_failure=False) as acquired:
                if not acquired:
                    raise _defer(key, window)
                return fn(*args, **kwargs)

        return wrapper

    return decorate
