"""System checks of the Django tasks backend: misconfigured TASKS, unserved tasks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from accounts.tasks import user_export
from jobs.tasks_framework.backend import DramatiqBackend
from jobs.tasks_framework.compat import task, task_backends

BACKEND = "jobs.tasks_framework.backend.DramatiqBackend"


@task
def defined_outside_tasks_modules() -> None:
    pass


def ids(messages: Sequence[object]) -> list[str]:
    return [getattr(m, "id", "") for m in messages]


@pytest.mark.django_db  # Django 6.1 model checks ask the database about JSON support
def test_it_reports_a_misconfigured_tasks_setting() -> None:
    bad = {"BACKEND": BACKEND, "QUEUES": "default", "OPTIONS": {"max_retries": -1, "nope": 1}}

    with override_settings(TASKS={"default": bad}):
        errors = [m for m in run_checks() if m.id == "jobs.E101"]

    assert sorted(m.msg for m in errors) == [
        "OPTIONS has an unknown key 'nope' (known: max_retries, min_backoff, max_backoff, "
        "time_limit, max_age, result_max_bytes, worker_queues)",
        "OPTIONS['max_retries'] must be a whole number >= 0, got -1",
        "QUEUES must be a list of queue names, got 'default'",
    ]


def test_the_shipped_tasks_setting_is_valid() -> None:
    assert "jobs.E101" not in ids(task_backends["default"].check())


def test_it_warns_about_a_task_on_a_queue_no_worker_serves() -> None:
    params = {"QUEUES": ["default", "exports"], "OPTIONS": {"worker_queues": ["default"]}}

    warnings = DramatiqBackend("default", params).check()

    unserved = [m for m in warnings if m.id == "jobs.W102"]
    assert [m.obj for m in unserved] == [user_export.module_path]
    # Serving the queue silences it.
    params["OPTIONS"] = {"worker_queues": ["default", "exports"]}
    assert "jobs.W102" not in ids(DramatiqBackend("default", params).check())


def test_it_warns_about_a_task_rundramatiq_would_not_import() -> None:
    warnings = task_backends["default"].check()

    hidden = {m.obj for m in warnings if m.id == "jobs.W103"}
    assert defined_outside_tasks_modules.module_path in hidden
    assert user_export.module_path not in hidden  # accounts/tasks.py is autodiscovered


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["64k", None], ids=["text", "none"])
def test_a_malformed_result_cap_is_a_check_error_not_a_crash(value: object) -> None:
    options = {"result_max_bytes": value}

    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check")
        with pytest.raises(ImproperlyConfigured, match="result_max_bytes"):
            user_export.enqueue(1)

    report = str(raised.value)
    assert "jobs.E101" in report
    assert f"OPTIONS['result_max_bytes'] must be a whole number >= 1, got {value!r}" in report


@pytest.mark.django_db
def test_malformed_queues_and_worker_queues_are_check_errors_not_crashes() -> None:
    bad = {"BACKEND": BACKEND, "QUEUES": 5, "OPTIONS": {"worker_queues": 7, "max_retries": "3"}}

    with override_settings(TASKS={"default": bad}):
        errors = [m.msg for m in run_checks() if m.id == "jobs.E101"]

    assert sorted(errors) == [
        "OPTIONS['max_retries'] must be a whole number >= 0, got '3'",
        "OPTIONS['worker_queues'] must be a list of queue names, got 7",
        "QUEUES must be a list of queue names, got 5",
    ]
