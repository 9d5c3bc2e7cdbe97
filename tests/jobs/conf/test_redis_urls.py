"""REDIS_URL: what redis-py connects with is accepted; what is refused is named, never
with its password."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url

from jobs.conf import dramatiq_broker, redis_cache
from jobs.conf.redis_urls import redacted_url, split_redis_url, with_options


def connection_kwargs(url: str) -> dict[str, Any]:
    """What redis-py connects with, once it has built a pool from ``url``."""
    redis.ConnectionPool.from_url(url)  # raises for a URL it refuses ("redis:/0")
    kwargs: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    return kwargs


@pytest.mark.parametrize(
    ("url", "broker", "cache"),
    [
        # Under Sentinel REDIS_URL's host is not used; redis-py connects to localhost.
        ("redis://:pw@/0", "redis://:pw@/0", "redis://:pw@/1"),
        ("redis://:6380/2", "redis://:6380/2", "redis://:6380/3"),
        # urlunsplit once wrote these as "redis:/0", which redis-py refuses
        ("redis:///0", "redis:///0", "redis:///1"),
        ("redis://", "redis:///0", "redis:///1"),
        (
            "rediss:///4?ssl_cert_reqs=none",
            "rediss:///4?ssl_cert_reqs=none",
            "rediss:///5?ssl_cert_reqs=none",
        ),
        ("unix:///run/redis.sock", "unix:///run/redis.sock?db=0", "unix:///run/redis.sock?db=1"),
    ],
)
def test_it_accepts_a_url_without_a_host_as_redis_py_does(
    url: str, broker: str, cache: str
) -> None:
    assert split_redis_url("REDIS_URL", url) == (broker, cache)
    # The client reads each as the original, on the original's db and the next
    original = connection_kwargs(url)
    for offset, derived in enumerate((broker, cache)):
        assert connection_kwargs(derived) == {**original, "db": original.get("db", 0) + offset}


def test_it_adds_options_to_a_url_without_a_host() -> None:
    assert with_options("redis:///0", socket_timeout=5) == "redis:///0?socket_timeout=5"
    assert connection_kwargs(with_options("redis:///0", socket_timeout=5))["socket_timeout"] == 5


# Each leaked its secret into the message before: a raw "/", "?" or "#" in the
# password ends urlsplit's netloc early (so it finds no password), a secret in the
# user name's place, ?password=, and "://" inside a scheme-less URL's query.
LEAKING = [
    "redis://:hunter2/x@redis:6379/0",
    "redis://:hunter/2@redis:6379/0",
    "redis://:123/hunter2@redis:6379/0",
    "redis://user:hunter2/x@redis:6379/0",
    "redis://:hunter2?x@redis:6379/0",
    "redis://:hunter2#x@redis:6379/0",
    "rediss://default:hunter2#@redis:6379/0",
    "redis://hunter2@redis:port/0",
    "redis://redis:6379/x?password=hunter2",
    "unix:///run/redis.sock?db=x&password=hunter2",
    "redis://redis:6379/0?db=1&password=hunter2",
    ":hunter2@redis:6379/0?ssl_ca_path=file://x",
]


@pytest.mark.parametrize("url", LEAKING)
@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("REDIS_URL", lambda url: split_redis_url("REDIS_URL", url)),
        ("dramatiq_broker(url)", dramatiq_broker),
        ("redis_cache(url)", redis_cache),
    ],
)
def test_a_refused_url_is_named_without_its_secret(
    url: str, name: str, build: Callable[[str], object]
) -> None:
    # Given a Redis URL with a secret in it, wrong in a way the parser reads otherwise
    # When a settings builder reads it
    with pytest.raises(ImproperlyConfigured) as refused:
        build(url)
    # Then the message names where it came from, and the secret is not in it
    message = str(refused.value)
    assert message.startswith(name), message
    assert "hunter" not in message, message
    assert "hunter" not in redacted_url(url)


def test_a_password_that_cut_the_url_short_is_told_how_to_encode() -> None:
    password = "hunter2/x?#"
    with pytest.raises(ImproperlyConfigured, match=r"quote\(password, safe=''\)"):
        split_redis_url("REDIS_URL", f"redis://:{password}@redis:6379/0")
    # Encoded as the message says, the URL works and the client reads the password back
    encoded = f"redis://:{quote(password, safe='')}@redis:6379/0"
    broker, _ = split_redis_url("REDIS_URL", encoded)
    assert connection_kwargs(broker)["password"] == password
    # A bad port after a well-formed password has nothing to do with encoding
    with pytest.raises(ImproperlyConfigured) as refused:
        split_redis_url("REDIS_URL", "redis://:pw@redis:port/0")
    assert "percent-encoded" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://redis:6379/0",
        "rediss://redis?ssl_ca_path=/etc/ssl/certs&ssl_cert_reqs=required",
        "redis://[fe80::1%25eth0]:6379/0?client_name=web",
        "unix:///run/redis.sock?db=3",
        "localhost:6379",
        "redis:///0",
    ],
)
def test_a_url_without_credentials_is_shown_as_it_is(url: str) -> None:
    assert redacted_url(url) == url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:pw@redis/0", "rediss://user:***@redis/0"),
        ("redis://:p@ss:w@redis/0", "redis://:***@redis/0"),
        ("REDIS://:pw@redis/0", "REDIS://:***@redis/0"),
        ("redis://redis/0?username=u&PASSWORD=pw", "redis://redis/0?username=***&PASSWORD=***"),
    ],
)
def test_it_masks_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.parametrize("db", ["²", "\u0663", "-1", "1.0"])
def test_a_database_number_must_be_ascii_digits(db: str) -> None:
    # "²".isdigit() is True, and int("²") a bare ValueError naming nothing
    with pytest.raises(ImproperlyConfigured, match=r"^REDIS_URL has a database number"):
        split_redis_url("REDIS_URL", f"redis://h:6379/{db}")
