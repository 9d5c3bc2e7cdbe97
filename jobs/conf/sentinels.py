"""Redis through Sentinel: parsing a list of Sentinels and a master name.

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

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

from jobs.conf.redis_urls import redacted_url

# The name ends up as the host part of django-redis's LOCATION URL, which
# urllib lowercases; other characters would not survive the URL either.
_MASTER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# A DNS name or IPv4 address; [IPv6]:port is matched on its own.
_HOST_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_BRACKETED_RE = re.compile(r"\[([^\[\]]*)\]:(.*)")
# ASCII digits only: str.isdigit() takes "٢٦٣٧٩" too, which int() reads as 26379.
_PORT_RE = re.compile(r"[0-9]{1,5}")


def parse_sentinels(name: str, value: str) -> list[tuple[str, int]]:
    """``"10.0.0.1:26379,redis-b:26379,[fd00::1]:26379"`` as ``[(host, port), ...]``.

    An IPv6 address goes in brackets: without them ``::1`` or ``fd00::1:26379``
    has no telling where the address ends and the port begins.
    """
    return [_parse_sentinel(name, item.strip()) for item in value.split(",")]


def _parse_sentinel(name: str, item: str) -> tuple[str, int]:
    if not item:
        raise ImproperlyConfigured(f"{name} has an empty entry: a stray comma?")
    if item.startswith("["):
        bracketed = _BRACKETED_RE.fullmatch(item)
        if not bracketed:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not [IPv6 address]:port, e.g. [::1]:26379"
            )
        host, port = bracketed.groups()
        if not _is_ipv6(host):
            raise ImproperlyConfigured(f"{name}: {item!r} has no IPv6 address in its brackets")
    elif item.count(":") > 1:
        raise ImproperlyConfigured(
            f"{name}: {item!r} looks like an IPv6 address without brackets; write it "
            "as [address]:port, e.g. [::1]:26379"
        )
    else:
        host, colon, port = item.partition(":")
        if not colon:
            raise ImproperlyConfigured(f"{name}: {item!r} has no port; write host:port")
        if not _HOST_RE.fullmatch(host):
            raise ImproperlyConfigured(
                f"{name}: {item!r} needs a host name or IPv4 address before the port"
            )
    if not _PORT_RE.fullmatch(port) or not 0 < int(port) < 65536:
        raise ImproperlyConfigured(f"{name}: {item!r} needs a port from 1 to 65535")
    return host, int(port)


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


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
            f"the cache URL must be a redis:// URL with Sentinel, got {redacted_url(cache_url)!r}"
        )
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{master}" if userinfo else master))
