"""Derive the broker and cache Redis URLs from one ``REDIS_URL``.

The broker keeps the database number given in the URL (default 0) and the cache
uses the next one, so ``FLUSHDB`` on the cache never drops queued jobs.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qs, urlencode, urlsplit

from django.core.exceptions import ImproperlyConfigured

_SCHEMES = {"redis", "rediss", "unix"}
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# redis-py reads credentials from the query too (?password=, ?username=).
_QUERY_SECRET_RE = re.compile(r"([?&](?:password|username)=)[^&#]*", re.IGNORECASE)
_ENCODE_HINT = (
    "; a password holding '/', '?' or '#' must be percent-encoded, "
    "urllib.parse.quote(password, safe='')"
)


def redacted_url(url: str) -> str:
    """``url`` with its credentials replaced by ``***``: safe for messages and logs.

    Whatever comes before the last "@" may be a password, even past a raw "/",
    "?" or "#" that made the URL's parser stop early; so is a ``?password=``. A
    URL without credentials is returned as it is.
    """
    scheme = _SCHEME_RE.match(url)
    head, rest = (scheme.group(0), url[scheme.end() :]) if scheme else ("", url)
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        # The user name helps whoever reads the message, unless it is a password
        # written without its ":" or one that holds what ends a user name.
        keep = bool(colon) and not re.search(r"[/?#]", user)
        rest = f"{user}:***@{rest}" if keep else f"***@{rest}"
    return head + _QUERY_SECRET_RE.sub(r"\1***", rest)


def _encode_hint(url: str) -> str:
    """The percent-encoding advice, when an "@" lies past where the host ends: a
    raw "/", "?" or "#" in the password cut the URL short."""
    rest = url.partition("://")[2]
    address = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return _ENCODE_HINT if "@" in rest and "@" not in address else ""


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
            f"to 65535, an IPv6 address goes in []){_encode_hint(url)}"
        ) from None
    if parts.scheme not in _SCHEMES or not url.startswith(f"{parts.scheme}://"):
        # "localhost:6379", the form redis-cli takes, is the usual slip.
        bare = re.fullmatch(r"[\w.-]+(:\d+)?(/\d+)?", url)
        raise ImproperlyConfigured(
            f"{name} must start with redis://, rediss:// or unix://, got {shown!r}"
            + (f"; write {'redis://' + url!r}" if bare else "")
        )
    # No host is allowed: redis-py then connects to localhost, and under Sentinel
    # REDIS_URL's host is not used at all.
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
    # ASCII digits only: str.isdigit() takes "²", which int() then refuses.
    if not re.fullmatch(r"[0-9]+", db):
        raise ImproperlyConfigured(
            f"{name} has a database number that is not an integer: "
            f"{redacted_url(url)!r}{_encode_hint(url)}"
        )
    return int(db)


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = parse_qs(parts.query)
        query["db"] = [str(db)]
        return _unsplit(parts._replace(query=urlencode(query, doseq=True)))
    return _unsplit(parts._replace(path=f"/{db}"))


def with_options(url: str, **options: object) -> str:
    """``url`` with query options added unless the URL already sets them."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    for key, value in options.items():
        query.setdefault(key, [str(value)])
    return _unsplit(parts._replace(query=urlencode(query, doseq=True)))


def _unsplit(parts: SplitResult) -> str:
    """``parts`` as a URL that keeps its "//" when the address part is empty:
    urlunsplit writes "unix:///path" as "unix:/path" and "redis:///0" as
    "redis:/0", which redis-py refuses."""
    query = f"?{parts.query}" if parts.query else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{query}{fragment}"


def split_redis_url(name: str, url: str) -> tuple[str, str]:
    """Return ``(broker_url, cache_url)`` for the URL held in variable ``name``."""
    db = _db_of(name, url)
    return with_db(url, db), with_db(url, db + 1)
