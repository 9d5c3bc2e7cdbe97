"""Redis through Sentinel: ``REDIS_SENTINELS`` and ``REDIS_SENTINEL_MASTER``.

When both are set, every Redis user (the Dramatiq broker, the cache, and
through them the locks, rate limiters, dedup keys and the scheduler's tick
claims) asks the Sentinels for the current primary instead of connecting to
``REDIS_URL``'s host. ``REDIS_URL`` still gives the database number, the
password and the socket options. A client notices a failover on its next
command: the old connection fails (or answers READONLY once the old primary
has come back as a replica), redis-py drops it and asks the Sentinels again
(``jobs/broker/sentinel.py`` builds the broker's client; django-redis's
``SentinelConnectionFactory`` the cache's).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

# The name ends up as the host part of django-redis's LOCATION URL, which
# urllib lowercases; other characters would not survive the URL either.
_MASTER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def parse_sentinels(name: str, value: str) -> list[tuple[str, int]]:
    """``"10.0.0.1:26379,10.0.0.2:26379"`` as ``[(host, port), ...]``."""
    sentinels = []
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        host = host.strip("[]")  # [::1]:26379
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(
                f"{name} must be comma-separated host:port pairs, got {value!r}"
            )
        sentinels.append((host, int(port)))
    return sentinels


def parse_master(name: str, value: str) -> str:
    if not _MASTER_RE.match(value):
        raise ImproperlyConfigured(
            f"{name} must be a Sentinel master name of lowercase letters, digits, "
            f"'.', '_' or '-', got {value!r}"
        )
    return value


def sentinel_config(
    sentinels_name: str, sentinels: str | None, master_name: str, master: str | None
) -> tuple[list[tuple[str, int]], str] | None:
    """Both variables parsed, or None when neither is set; one alone is an error."""
    if not sentinels and not master:
        return None
    if not sentinels or not master:
        missing = sentinels_name if not sentinels else master_name
        raise ImproperlyConfigured(
            f"{missing} must be set too: {sentinels_name} and {master_name} go together"
        )
    return parse_sentinels(sentinels_name, sentinels), parse_master(master_name, master)


def cache_location(master: str, cache_url: str) -> str:
    """django-redis's LOCATION for its Sentinel connection factory: the host is the
    master's name; credentials, db number and options stay those of ``cache_url``."""
    parts = urlsplit(cache_url)
    if parts.scheme != "redis":
        raise ImproperlyConfigured(
            f"REDIS_URL must be a redis:// URL with REDIS_SENTINELS, got {cache_url!r}"
        )
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{master}" if userinfo else master))
