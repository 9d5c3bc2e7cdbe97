"""Signup rate limit per client IP and per email, in Redis (``SIGNUP_RATE_LIMIT``).

A fixed window per key: INCR and EXPIRE in one round trip. Every web process
shares the count through Redis, so the limit holds across gunicorn workers. If
Redis is unreachable the limit fails open (logged): losing signups to protect
against abuse would be the worse trade.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django_redis import get_redis_connection
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int = 0


def _key(kind: str, value: str, window: int) -> str:
    # surrogatepass: the limiter runs before validation, so it sees hostile text
    # too (a JSON "\ud800" is a lone surrogate, which plain UTF-8 refuses); any
    # string must hash, and the form then rejects it with a field error.
    digest = hashlib.sha256(value.strip().lower().encode("utf-8", "surrogatepass")).hexdigest()
    digest = digest[:32]
    return f"ratelimit:signup:{kind}:{digest}:{window}"


def signup_allowed(*, ip: str, email: str | None) -> Verdict:
    """Count this attempt against the IP (and email) budgets; deny when one is spent."""
    rate = settings.SIGNUP_RATE_LIMIT
    if rate is None:
        return Verdict(allowed=True)
    now = int(time.time())
    window = now // rate.seconds
    keys = [_key("ip", ip, window)]
    if email:
        keys.append(_key("email", email, window))
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for key in keys:
            pipe.incr(key)
            pipe.expire(key, rate.seconds + 1)
        counts = pipe.execute()[::2]
    except RedisError as exc:
        logger.warning("Signup rate limit unavailable, allowing: %s", exc)
        return Verdict(allowed=True)
    if max(counts) > rate.requests:
        return Verdict(allowed=False, retry_after=(window + 1) * rate.seconds - now)
    return Verdict(allowed=True)
