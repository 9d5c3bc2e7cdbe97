"""Rate limits of signup and login, per client address (and email or user name), in Redis.

``SIGNUP_RATE_LIMIT`` counts signups per client IP and per email. ``LOGIN_RATE_LIMIT``
counts login attempts per (client IP, user name) pair, and per IP at five times
that rate: keyed on the name alone, anyone could lock the superuser out (the name
is public), and keyed on the pair alone, one address could try a password on
every name.

A fixed window per key: INCR and EXPIRE in one round trip. Every web process
shares the count through Redis, so the limit holds across gunicorn workers. If
Redis is unreachable the limit fails open (logged): losing signups and logins to
protect against abuse would be the worse trade (docs/explanation/security.md).
"""

from __future__ import annotations

import hashlib
import logging
import time
import unicodedata
from dataclasses import dataclass

from django.conf import settings
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from project.env import Rate

logger = logging.getLogger(__name__)
# A login budget per address, as a multiple of the per-pair one.
LOGIN_IP_FACTOR = 5


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: int = 0


def _key(scope: str, kind: str, value: str, window: int) -> str:
    # surrogatepass: the limiter runs before validation, so it sees hostile text
    # too (a JSON "\ud800" is a lone surrogate, which plain UTF-8 refuses); any
    # string must hash, and the form then rejects it with a field error.
    digest = hashlib.sha256(value.strip().lower().encode("utf-8", "surrogatepass")).hexdigest()
    digest = digest[:32]
    return f"ratelimit:{scope}:{kind}:{digest}:{window}"


def _allowed(scope: str, rate: Rate | None, budgets: dict[str, tuple[str, int]]) -> Verdict:
    """Count one attempt against each ``kind: (value, limit)``; deny when one is spent."""
    if rate is None:
        return Verdict(allowed=True)
    if recently_unreachable():
        return Verdict(allowed=True)  # fails open, without waiting on Redis again
    now = int(time.time())
    window = now // rate.seconds
    kinds = list(budgets)
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for kind in kinds:
            pipe.incr(_key(scope, kind, budgets[kind][0], window))
            pipe.expire(_key(scope, kind, budgets[kind][0], window), rate.seconds + 1)
        counts = pipe.execute()[::2]
    except RedisError as exc:
        if isinstance(exc, UNREACHABLE):
            note_unreachable(exc)
        logger.warning("%s rate limit unavailable, allowing: %s", scope.capitalize(), exc)
        return Verdict(allowed=True)
    if any(count > budgets[kind][1] for kind, count in zip(kinds, counts, strict=True)):
        return Verdict(allowed=False, retry_after=(window + 1) * rate.seconds - now)
    return Verdict(allowed=True)


def signup_allowed(*, ip: str, email: str | None) -> Verdict:
    """Count this signup against the IP (and email) budgets; deny when one is spent."""
    rate = settings.SIGNUP_RATE_LIMIT
    budgets = {"ip": (ip, rate.requests if rate else 0)}
    if email:
        budgets["email"] = (email, rate.requests if rate else 0)
    return _allowed("signup", rate, budgets)


def login_allowed(*, ip: str, username: str) -> Verdict:
    """Count this login attempt against the (IP, user name) and IP budgets."""
    # The name as the login form reads it (stripped, NFKC): " ada" or a
    # full-width "ada" (U+FF41...) logs in as ada, so it must share its budget.
    username = unicodedata.normalize("NFKC", username).strip()
    rate = settings.LOGIN_RATE_LIMIT
    requests = rate.requests if rate else 0
    return _allowed(
        "login",
        rate,
        {"pair": (f"{ip}\x1f{username}", requests), "ip": (ip, requests * LOGIN_IP_FACTOR)},
    )
