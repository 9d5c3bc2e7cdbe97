"""Derive the broker and cache Redis URLs from one ``REDIS_URL``.

The broker keeps the database number given in the URL (default 0) and the cache
uses the next one, so ``FLUSHDB`` on the cache never drops queued jobs.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qs, urlencode, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

_SCHEMES = {"redis", "rediss", "unix"}


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: safe for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        return _without_userinfo(url)
    if not url.startswith(f"{parts.scheme}://"):
        # No "scheme://" ("localhost:6379", ":pw@host:6379"): urlsplit finds no
        # password in it, yet what comes before an "@" may be one.
        return _without_userinfo(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _without_userinfo(url: str) -> str:
    """``url`` with everything between ``scheme://`` and its last ``@`` as ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}"


def check_redis_url(name: str, url: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``name`` unless ``url`` is a Redis URL."""
    _db_of(name, url)


def _split(name: str, url: str) -> SplitResult:
    """``url``'s parts, once it is a URL the Redis client can connect with."""
    shown = redacted_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # reading it raises for a port that is not a number
    except ValueError:
        # The error's own text is not shown: it may quote a password put in the wrong place.
        raise ImproperlyConfigured(
            f"{name} has a malformed host or port: {shown!r} (a port is a number from 1 "
            "to 65535, an IPv6 address goes in [])"
        ) from None
    if parts.scheme not in _SCHEMES or not url.startswith(f"{parts.scheme}://"):
        # "localhost:6379", the form redis-cli takes, is the usual slip.
        bare = re.fullmatch(r"[\w.-]+(:\d+)?(/\d+)?", url)
        raise ImproperlyConfigured(
            f"{name} must start with redis://, rediss:// or unix://, got {shown!r}"
            + (f"; write {'redis://' + url!r}" if bare else "")
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ImproperlyConfigured(f"{name} has no host: {shown!r}")
    if port == 0:
        raise ImproperlyConfigured(f"{name} needs a port from 1 to 65535: {shown!r}")
    return parts


def _db_of(name: str, url: str) -> int:
    parts = _split(name, url)
    if parts.scheme == "unix":
        db = parse_qs(parts.query).get("db", ["0"])[0]
    elif "db" in parse_qs(parts.query):
        # The client would take ?db= over the path, which with_db() sets: the
        # cache would share the broker's database.
        raise ImproperlyConfigured(
            f"{name} gives its database as ?db=: put it in the path, "
            f"redis://host:port/<db>, got {redacted_url(url)!r}"
        )
    else:
        db = parts.path.lstrip("/") or "0"
    if not db.isdigit():
        raise ImproperlyConfigured(
            f"{name} has a database number that is not an integer: {redacted_url(url)!r}"
        )
    return int(db)


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = parse_qs(parts.query)
        query["db"] = [str(db)]
        # urlunsplit would collapse "unix:///path" to "unix:/path".
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query, doseq=True)}"
    return urlunsplit(parts._replace(path=f"/{db}"))


def with_options(url: str, **options: object) -> str:
    """``url`` with query options added unless the URL already sets them."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    for key, value in options.items():
        query.setdefault(key, [str(value)])
    encoded = urlencode(query, doseq=True)
    if parts.scheme == "unix":
        return f"unix://{parts.netloc}{parts.path}?{encoded}"
    return urlunsplit(parts._replace(query=encoded))


def split_redis_url(name: str, url: str) -> tuple[str, str]:
    """Return ``(broker_url, cache_url)`` for the URL held in variable ``name``."""
    db = _db_of(name, url)
    return with_db(url, db), with_db(url, db + 1)
