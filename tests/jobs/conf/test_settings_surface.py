"""One settings surface: every knob has a default, a wrong value is named by a check."""

from __future__ import annotations

import pytest
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured

from jobs.conf import MIDDLEWARE, dramatiq_broker, jobs_settings, redis_cache
from jobs.conf.checks import (
    check_broker,
    check_cache,
    check_names,
    check_values,
    cron_problem,
)
from jobs.conf.defaults import DEFAULTS


def test_it_falls_back_to_the_default_of_every_setting_a_project_leaves_out(settings) -> None:
    # Given a project that sets none of the platform's knobs
    for name in DEFAULTS:
        if hasattr(settings, name):
            delattr(settings, name)
    settings.TIME_ZONE = "Europe/Berlin"
    # Then each reads its default, computed ones from the other settings
    assert jobs_settings.JOBS_MAX_RETRIES == 2
    assert jobs_settings.JOBS_CACHE == "default"
    assert jobs_settings.JOBS_SCHEDULE_TZ == "Europe/Berlin"
    assert jobs_settings.JOBS_OUTBOX_WAIT_REPLICAS == 0
    assert check_values() == []


def test_it_reads_the_projects_value_at_each_access(settings) -> None:
    settings.JOBS_MAX_RETRIES = 7
    assert jobs_settings.JOBS_MAX_RETRIES == 7
    settings.JOBS_MAX_RETRIES = 0
    assert jobs_settings.JOBS_MAX_RETRIES == 0


def test_it_refuses_a_name_that_is_not_a_setting() -> None:
    with pytest.raises(AttributeError, match="JOBS_MAX_RETRY"):
        jobs_settings.JOBS_MAX_RETRY  # noqa: B018


def test_outbox_waits_for_a_replica_by_default_under_sentinel(settings) -> None:
    del settings.JOBS_OUTBOX_WAIT_REPLICAS
    settings.DRAMATIQ_BROKER = dramatiq_broker(
        "redis://:secret@10.0.0.1:6379/0", sentinels="10.0.0.2:26379", sentinel_master="main"
    )
    assert jobs_settings.JOBS_OUTBOX_WAIT_REPLICAS == 1


def test_the_broker_helper_lists_every_middleware_and_fails_fast_on_a_dead_redis() -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/3", extra_middleware=["my.Middleware"])
    assert broker["MIDDLEWARE"] == [*MIDDLEWARE, "my.Middleware"]
    assert (
        "socket_connect_timeout=0.5" in broker["OPTIONS"]["url"]
    )  # a request's (jobs.conf.timeouts)
    assert broker["OPTIONS"]["url"].startswith("redis://127.0.0.1:6379/3?")


def test_the_helpers_name_a_bad_url_without_its_password() -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        dramatiq_broker("http://:hunter2@redis:6379/0")
    assert "dramatiq_broker(url)" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ValueError, match="go together"):
        redis_cache("redis://127.0.0.1:6379/1", sentinels="10.0.0.2:26379")


def test_it_reports_a_missing_broker_setting(settings) -> None:
    # Without DRAMATIQ_BROKER django_dramatiq would quietly use RabbitMQ. (A
    # process started without it: tests/e2e/test_adoption.py.)
    del settings.DRAMATIQ_BROKER
    [error] = check_broker()
    assert error.id == "jobs.E002"
    assert "DRAMATIQ_BROKER is not set" in error.msg
    assert "dramatiq_broker(" in (error.hint or "")


def test_it_reports_a_malformed_broker_setting(settings) -> None:
    settings.DRAMATIQ_BROKER = "redis://127.0.0.1:6379/0"
    [error] = check_broker()
    assert "DRAMATIQ_BROKER is malformed ('redis://" in error.msg


def test_it_reports_middleware_a_hand_written_list_forgot(settings) -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/0")
    broker["MIDDLEWARE"] = [m for m in broker["MIDDLEWARE"] if not m.endswith(".Retries")]
    settings.DRAMATIQ_BROKER = broker
    [error] = check_broker()
    assert error.id == "jobs.E003"
    assert "jobs.middleware.retries.Retries" in error.msg


def test_the_shipped_settings_pass_every_check() -> None:
    assert check_broker() + check_cache() + check_values() + check_names() == []


def test_it_reports_a_cache_that_cannot_lock(settings) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    settings.JOBS_CACHE = "local"
    [error] = check_cache()
    assert error.id == "jobs.E004"
    assert "django-redis" in error.msg
    settings.JOBS_CACHE = "nowhere"
    [error] = check_cache()
    assert "'nowhere'" in error.msg


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("JOBS_MAX_RETRIES", "3", "must be int"),
        ("JOBS_MAX_RETRIES", True, "must be int"),
        ("JOBS_MAX_RETRIES", -1, "at least 0"),
        ("JOBS_LEDGER_ENABLED", "yes", "must be bool"),
        ("JOBS_SCHEDULE_TZ", "Mars/Olympus", "not a time zone"),
        ("JOBS_REPORT_CRON", "0 6 * *", "5 fields"),
        ("JOBS_WATCHDOG_CRON", "61 * * * *", "out of range"),
        ("JOBS_PRUNE_CRON", "a b c d e", "cannot read"),
        ("JOBS_PERIODIC", ["watchdog", "reports"], "'reports'"),
        ("JOBS_PERIODIC", None, "must be tuple or list"),
        ("JOBS_WATCHDOG_CRON", "*/0 * * * *", "step of 0"),
        ("JOBS_WATCHDOG_CRON", "5-1 * * * *", "runs backwards"),
        ("JOBS_WATCHDOG_CRON", "", "5 fields"),
        ("JOBS_WATCHDOG_CRON", 5, "must be str"),
        ("JOBS_REPORT_CRON", "@sometimes", "not a name periodiq knows"),
        ("JOBS_REPORT_CATCH_UP_HOURS", "12", "must be int"),
        ("JOBS_METRICS_ALLOWED_IPS", ["10.0.0.0/33"], "not an address or network"),
        ("JOBS_CACHE", ["default"], "must be str"),
    ],
)
def test_it_names_a_setting_with_a_wrong_value(settings, name, value, complaint) -> None:
    setattr(settings, name, value)
    [error] = check_values()
    assert isinstance(error, Error)
    assert error.id == "jobs.E005"
    assert error.msg.startswith(name)
    assert complaint in error.msg


def test_it_suggests_the_setting_a_typo_meant(settings) -> None:
    settings.JOBS_MAX_RETRYS = 5
    [warning] = check_names()
    assert warning.id == "jobs.W002"
    assert warning.hint == "Did you mean JOBS_MAX_RETRIES?"


@pytest.mark.parametrize(
    "spec", ["* * * * *", "0 6 * * *", "*/15 0-6,22-23 1 1-12/2 0,7", "@daily", "0 9 * * MON-fri"]
)
def test_it_accepts_cron_expressions_periodiq_runs(spec: str) -> None:
    assert cron_problem(spec) is None


def test_the_settings_reference_documents_every_setting() -> None:
    from pathlib import Path

    from jobs.conf.reference import reference_table

    page = (Path(__file__).resolve().parents[3] / "docs/reference/settings.md").read_text()
    assert reference_table() in page, "run python -m jobs.conf.reference into the page"


def test_a_list_value_for_the_cache_alias_does_not_crash_the_cache_check(settings) -> None:
    settings.JOBS_CACHE = ["default"]
    assert check_cache() == []  # check_values names it (above)


def test_it_reports_a_sharded_cache_that_cannot_lock(settings) -> None:
    cache = redis_cache("redis://127.0.0.1:6379/1")
    cache["OPTIONS"]["CLIENT_CLASS"] = "django_redis.client.ShardClient"
    settings.CACHES = {**settings.CACHES, "default": cache}
    [error] = check_cache()
    assert error.id == "jobs.E004"
    assert "ShardClient" in error.msg


def test_it_accepts_a_subclass_of_the_platforms_broker(settings) -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/0")
    broker["BROKER"] = "tests.jobs.conf.custom_broker.CustomBroker"
    settings.DRAMATIQ_BROKER = broker
    assert check_broker() == []


def test_it_reports_dramatiqs_own_retries_beside_the_platforms(settings) -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/0")
    broker["MIDDLEWARE"].append("dramatiq.middleware.Retries")
    settings.DRAMATIQ_BROKER = broker
    [error] = check_broker()
    assert error.id == "jobs.E003"
    assert "dramatiq.middleware.Retries" in error.msg


def test_it_reports_the_platforms_middleware_out_of_order(settings) -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/0")
    broker["MIDDLEWARE"].reverse()
    settings.DRAMATIQ_BROKER = broker
    [error] = check_broker()
    assert "out of order" in error.msg


def test_it_names_the_settings_that_were_renamed(settings) -> None:
    settings.WATCHDOG_CRON = "* * * * *"
    settings.JOB_MAX_RETRIES = 3
    hints = sorted(w.hint or "" for w in check_names())
    assert hints == ["Did you mean JOBS_MAX_RETRIES?", "Did you mean JOBS_WATCHDOG_CRON?"]


def test_the_helpers_take_one_url_and_a_database_number() -> None:
    url = "redis://:pw@10.0.0.1:6379/0?health_check_interval=30"
    broker = dramatiq_broker(url, db=0)["OPTIONS"]["url"]
    cache = redis_cache(url, db=1)["LOCATION"]
    assert broker.startswith("redis://:pw@10.0.0.1:6379/0?health_check_interval=30")
    assert cache == "redis://:pw@10.0.0.1:6379/1?health_check_interval=30"


def test_the_stand_in_broker_refuses_to_lose_a_message() -> None:
    import dramatiq

    from jobs.broker.unconfigured import UnconfiguredBroker

    broker = UnconfiguredBroker(middleware=[])
    message: dramatiq.Message[object] = dramatiq.Message(
        queue_name="default", actor_name="x", args=(), kwargs={}, options={}
    )
    with pytest.raises(ImproperlyConfigured, match="DRAMATIQ_BROKER is not set"):
        broker.enqueue(message)
