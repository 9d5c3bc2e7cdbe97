"""``jobs schedules`` and ``jobs audit``: the console's schedules and trail from a terminal."""

from __future__ import annotations

import getpass

import pytest

from jobs.ledger import audit
from jobs.models import AuditEntry, ScheduleOverride
from jobs.scheduling import overrides
from tests.jobs.management.test_jobs_command import jobs

pytestmark = pytest.mark.django_db


def test_it_lists_the_periodic_jobs_as_the_schedulers_follow_them() -> None:
    ScheduleOverride.objects.create(actor_name="daily_report", cron="30 5 * * *")

    listed = {s["actor"]: s for s in jobs("schedules", "--json").json()["schedules"]}
    text = jobs("schedules").out

    assert listed["daily_report"]["cron"] == "30 5 * * *"
    assert listed["daily_report"]["overridden"] is True
    assert listed["watchdog"]["enabled"] is True
    assert "30 5 * * * (code: " in text


def test_it_changes_a_schedule_as_the_admin_does_and_records_the_os_user() -> None:
    edited = jobs("schedules", "daily_report", "--cron", "30 5 * * *")
    off = jobs("schedules", "watchdog", "--disable", "--json")
    again = jobs("schedules", "watchdog", "--disable")  # nothing to change

    assert edited.code == 0
    assert "cron 0 6 * * * -> 30 5 * * *" in edited.out
    assert off.json()["enabled"] is False
    assert "unchanged" in again.out
    assert overrides.read_overrides()["watchdog"].enabled is False
    trail = list(AuditEntry.objects.order_by("id").values_list("action", "who", "source"))
    me = f"os:{getpass.getuser()}"
    assert trail == [("schedule_edit", me, "cli"), ("schedule_disable", me, "cli")]

    reset = jobs("schedules", "watchdog", "--reset")
    assert reset.code == 0
    assert "watchdog" not in overrides.read_overrides()


def test_a_bad_schedule_change_is_a_usage_error() -> None:
    assert jobs("schedules", "nope", "--enable").code == 2
    bad = jobs("schedules", "daily_report", "--cron", "0 0 31 4 *")
    assert bad.code == 2
    assert "never runs" in bad.err
    assert jobs("schedules", "daily_report").code == 2  # an actor, no change
    assert jobs("schedules", "--reset").code == 2  # a change, no actor
    assert not ScheduleOverride.objects.exists()


def test_it_lists_the_trail_or_the_entries_naming_one_job() -> None:
    audit.record("pause", who="ops", target="queue emails", count=0)
    audit.record("retry", who="ops", message_ids=["m-1", "m-2"])

    everything = jobs("audit", "--json").json()["entries"]
    one = jobs("audit", "--job", "m-2", "--json").json()["entries"]
    text = jobs("audit").out

    assert [e["action"] for e in everything] == ["retry", "pause"]
    assert [e["message_ids"] for e in one] == [["m-1", "m-2"]]
    assert "queue emails" in text
