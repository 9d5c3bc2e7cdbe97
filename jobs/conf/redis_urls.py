"""Derive the broker and cache Redis URLs from one ``REDIS_URL``.

The broker keeps the database number given in the URL (default 0) and the cache
uses the next one, so ``FLUSHDB`` on the cache never drops queued jobs.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

_SCHEMES = {"redis", "rediss", "unix"}


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: safe for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_redis_url(name: str, url: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``name`` unless ``url`` is a Redis URL."""
    _db_of(name, url)


def _db_of(name: str, url: str) -> int:
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ImproperlyConfigured(
            f"{name} must start with redis://, rediss:// or unix://, got {redacted_url(url)!r}"
        )
    if parts.scheme == "unix":
        db = parse_qs(parts.query).get("db", ["0"])[0]
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
