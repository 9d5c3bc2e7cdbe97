"""Start-up configuration: a malformed variable stops the process and is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs.conf.redis_urls import split_redis_url
from jobs.conf.sentinels import cache_location, parse_sentinels
from project.env import Rate, parse_rate

ROOT = Path(__file__).resolve().parents[1]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run manage.py in a fresh process with only ``env`` on top of a clean environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBS_"))}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "project.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def start_django(**env: str) -> subprocess.CompletedProcess[str]:
    return manage("check", **env)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DJANGO_DEBUG", "maybe"),
        ("REDIS_URL", "http://localhost:6379"),
        ("REDIS_URL", "redis://localhost:6379/x"),
        ("DATABASE_URL", "nosuchdb://x"),
        ("SIGNUP_RATE_LIMIT", "ten per minute"),
        ("JOBS_MAX_RETRIES", "-1"),
        ("JOBS_MIN_BACKOFF_MS", "5s"),
        ("REDIS_SENTINELS", "10.0.0.1"),
        ("REDIS_SENTINELS", "10.0.0.1:26379,:26379"),
        ("REDIS_SENTINELS", "10.0.0.1:port"),
        ("REDIS_SENTINELS", "::1"),
        ("REDIS_SENTINEL_MASTER", "My Master"),
    ],
)
def test_a_malformed_variable_fails_start_up_naming_it(name: str, value: str) -> None:
    # The Sentinel pair only means something together: the other half is valid.
    pair = {"REDIS_SENTINELS": "127.0.0.1:26379", "REDIS_SENTINEL_MASTER": "mymaster"}
    pair.pop(name, None)
    extra = pair if name.startswith("REDIS_SENTINEL") else {}
    result = start_django(**{**extra, name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


@pytest.mark.parametrize(
    "value",
    [
        ":hunter2@redis:6379",  # no scheme: urlsplit sees no password in it
        "user:hunter2@redis:6379",
        "http://:hunter2@redis:6379",
        "redis://:hunter2@redis:port/0",  # until checked: redis-py's ValueError at boot
        "redis://:hunter2@[::1/0",
        "redis://:hunter2/x@redis:6379/0",  # a raw "/" ends urlsplit's netloc early
        "redis://hunter2@redis:port/0",  # the password without its ":"
        "redis://redis:6379/x?password=hunter2",
        "redis://:hunter2@redis:6379/0?db=3",  # until checked: the cache on the broker's db
    ],
)
def test_a_malformed_redis_url_is_named_without_its_password(value: str) -> None:
    # Given a REDIS_URL a person got wrong, with a password in it
    # When Django starts
    result = start_django(REDIS_URL=value)
    # Then the last line names the variable the person set, not the helper it
    # reached (dramatiq_broker(url)) or redis-py's parser, and the password is
    # nowhere in the output
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: REDIS_URL "), last
    assert "hunter2" not in result.stdout + result.stderr


@pytest.mark.parametrize("value", ["redis://:s3cret@/0", "redis://:6380/0", "redis:///0"])
def test_a_redis_url_without_a_host_starts_as_under_sentinel(value: str) -> None:
    # Under Sentinel REDIS_URL's host is not used (docs/howto/several-hosts.md)
    sentinel = {"REDIS_SENTINELS": "127.0.0.1:26379", "REDIS_SENTINEL_MASTER": "mymaster"}
    result = start_django(REDIS_URL=value, **sentinel)
    assert result.returncode == 0, result.stderr


def test_a_redis_url_without_its_scheme_is_told_how_to_write_it() -> None:
    # redis-cli takes host:port, so that is what people paste
    result = start_django(REDIS_URL="localhost:6379")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "django.core.exceptions.ImproperlyConfigured: REDIS_URL must start with redis://, "
        "rediss:// or unix://, got 'localhost:6379'; write 'redis://localhost:6379'"
    )


def test_production_refuses_the_insecure_dev_secret_key() -> None:
    result = start_django(DJANGO_DEBUG="0")
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.parametrize("weak", ["x", "k" * 49, "ab" * 40])
def test_production_refuses_a_weak_secret_key(weak: str) -> None:
    result = start_django(DJANGO_DEBUG="0", DJANGO_SECRET_KEY=weak)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be a strong secret" in result.stderr


PRODUCTION_KEY = "k" * 60 + "-production-like-secret-value"


def production_setting(expression: str, **env: str) -> str:
    code = f"from django.conf import settings; print({expression})"
    result = manage("shell", "-c", code, DJANGO_DEBUG="0", DJANGO_SECRET_KEY=PRODUCTION_KEY, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]  # after Django 5.2's "objects imported" line


def test_x_forwarded_proto_is_trusted_only_when_said_so() -> None:
    # gunicorn exposed directly: a client's X-Forwarded-Proto must not make it https
    assert production_setting("settings.SECURE_PROXY_SSL_HEADER") == "None"
    trusted = production_setting(
        "settings.SECURE_PROXY_SSL_HEADER", DJANGO_TRUST_X_FORWARDED_PROTO="1"
    )
    assert trusted == "('HTTP_X_FORWARDED_PROTO', 'https')"


def test_whitenoise_serves_after_the_security_middleware_without_cors() -> None:
    order = production_setting("settings.MIDDLEWARE").split(", ")
    security = order.index("'django.middleware.security.SecurityMiddleware'")
    assert order[security + 1] == "'whitenoise.middleware.WhiteNoiseMiddleware'"
    assert production_setting("settings.WHITENOISE_ALLOW_ALL_ORIGINS") == "False"


def test_plain_http_deploys_pass_the_deploy_check_having_said_so() -> None:
    # docker-compose's default: no TLS, redirect off on purpose (W008 silenced)
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=PRODUCTION_KEY,
        DJANGO_SECURE_SSL_REDIRECT="0",
        JOBS_MAIL_RECIPIENTS="ops@example.com",
    )
    assert result.returncode == 0, result.stderr


def test_production_settings_pass_the_deploy_check() -> None:
    secret = "k" * 60 + "-production-like-secret-value"
    production = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secret}
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        **production,
        JOBS_MAIL_RECIPIENTS="ops@example.com",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    # With no one named (ADMINS is empty unless set), the report would mail no one
    result = manage("check", "--deploy", **production)
    assert "(jobs.W004) daily_report and watchdog will run but mail no one" in result.stderr


@pytest.mark.parametrize("name", ["REDIS_SENTINELS", "REDIS_SENTINEL_MASTER"])
def test_it_refuses_half_of_the_sentinel_pair(name: str) -> None:
    value = {"REDIS_SENTINELS": "127.0.0.1:26379", "REDIS_SENTINEL_MASTER": "mymaster"}[name]
    result = start_django(**{name: value})
    assert result.returncode != 0
    other = "REDIS_SENTINEL_MASTER" if name == "REDIS_SENTINELS" else "REDIS_SENTINELS"
    assert f"ImproperlyConfigured: {other} must be set too" in result.stderr


def test_it_parses_sentinel_addresses() -> None:
    assert parse_sentinels("S", "10.0.0.1:26379, redis-b:26380,[::1]:26381,[fe80::1%eth0]:1") == [
        ("10.0.0.1", 26379),
        ("redis-b", 26380),
        ("::1", 26381),
        ("fe80::1%eth0", 1),
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # Bare IPv6: "::1" once read as host ":" port 1, "fe80::1" as host "fe80:".
        ("::1", "IPv6 address without brackets"),
        ("fe80::1", "IPv6 address without brackets"),
        ("fd00::1:26379", "IPv6 address without brackets"),
        ("[::1]", r"not \[IPv6 address\]:port"),
        ("[redis-a]:26379", "no IPv6 address in its brackets"),
        ("redis-a", "no port"),
        ("my host:26379", "host name or IPv4 address"),
        (":26379", "host name or IPv4 address"),
        ("redis-a:\u0662\u0666\u0663\u0667\u0669", "port from 1 to 65535"),  # Arabic-Indic digits
        ("redis-a:0", "port from 1 to 65535"),
        ("redis-a:26379,", "empty entry"),
    ],
)
def test_it_refuses_an_ambiguous_or_incomplete_sentinel_address(value: str, reason: str) -> None:
    # Given a REDIS_SENTINELS value a person could mean two ways, or that lacks a part
    # When it is parsed
    # Then start-up stops with a message that names the variable and the problem
    with pytest.raises(ImproperlyConfigured, match=reason) as refused:
        parse_sentinels("REDIS_SENTINELS", value)
    assert str(refused.value).startswith("REDIS_SENTINELS")


def test_it_keeps_the_cache_urls_password_and_db_under_sentinel() -> None:
    assert cache_location("mymaster", "redis://:s3cret@redis:6379/3") == (
        "redis://:s3cret@mymaster/3"
    )
    assert cache_location("mymaster", "redis://redis/1?x=1") == "redis://mymaster/1?x=1"


def test_the_defaults_start_without_any_variable() -> None:
    result = start_django()
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/m", Rate(10, 60)),
        ("100/h", Rate(100, 3600)),
        ("5/30s", Rate(5, 30)),
        ("off", None),
        ("OFF", None),
    ],
)
def test_it_parses_rates(text: str, expected: Rate | None) -> None:
    assert parse_rate("X", text) == expected


@pytest.mark.parametrize("text", ["", "10", "0/m", "10/w", "-1/m", "a/m"])
def test_it_rejects_malformed_rates(text: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="X"):
        parse_rate("X", text)


def test_broker_and_cache_use_neighbouring_redis_databases() -> None:
    assert split_redis_url("R", "redis://h:1/0") == ("redis://h:1/0", "redis://h:1/1")
    assert split_redis_url("R", "redis://:pw@h:1") == ("redis://:pw@h:1/0", "redis://:pw@h:1/1")
    assert split_redis_url("R", "rediss://h/4") == ("rediss://h/4", "rediss://h/5")
    assert split_redis_url("R", "unix:///tmp/r.sock?db=2") == (
        "unix:///tmp/r.sock?db=2",
        "unix:///tmp/r.sock?db=3",
    )
