"""The Schedules page: edit a cron, switch a schedule off and on, reset, run now, audited."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.http.response import HttpResponseBase
from django.test import Client
from django.utils import timezone

from jobs.models import AuditEntry, Job, ScheduleOverride
from tests.conftest import queued_messages

pytestmark = pytest.mark.django_db
PAGE = "/admin/jobs/job/schedules/"
ACTOR = "daily_report"  # the platform's, "0 6 * * *" in the code


def change(client: Client, verb: str, **data: str) -> HttpResponseBase:
    return client.post(f"{PAGE}{ACTOR}/{verb}/", data)


@pytest.fixture
def staff(client: Client) -> Client:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    return client


@pytest.fixture
def viewer(client: Client) -> Client:
    """Staff who may see jobs but not run or change schedules."""
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.login(username="viewer", password="pw")
    return client


def audit() -> list[tuple[str, str, str, str]]:
    return list(AuditEntry.objects.order_by("id").values_list("action", "who", "target", "note"))


def test_a_bad_cron_is_shown_on_the_page_and_not_stored(staff: Client) -> None:
    response = staff.post(f"{PAGE}{ACTOR}/edit/", {"cron": "0 6 * * * *"})

    assert response.status_code == 200
    html = response.content.decode()
    assert '<ul class="errorlist"><li>The cron expression must have 5 fields' in html
    assert 'value="0 6 * * * *"' in html  # what was typed, to correct it
    assert not ScheduleOverride.objects.exists()
    assert audit() == []


def test_an_empty_cron_is_refused_with_a_message(staff: Client) -> None:
    html = staff.post(f"{PAGE}{ACTOR}/edit/", {"cron": "  "}).content.decode()

    assert "Enter a cron expression" in html
    assert not ScheduleOverride.objects.exists()


def test_a_good_edit_is_stored_audited_and_shown(staff: Client) -> None:
    response = staff.post(f"{PAGE}{ACTOR}/edit/", {"cron": "30  7 * * 1-5"})

    assert response.status_code == 302
    row = ScheduleOverride.objects.get(actor_name=ACTOR)
    assert (row.cron, row.enabled, row.updated_by) == ("30 7 * * 1-5", True, "root")
    assert audit() == [("schedule_edit", "root", ACTOR, "cron 0 6 * * * -> 30 7 * * 1-5")]
    html = staff.get(PAGE).content.decode()
    assert "<code>30 7 * * 1-5</code>" in html
    assert '<strong class="schedule-origin">override</strong>' in html
    assert "code's default: <code>0 6 * * *</code>" in html
    assert "Reset to default" in html


def test_disable_and_enable_switch_the_schedule(staff: Client) -> None:
    assert change(staff, "disable").status_code == 302
    assert ScheduleOverride.objects.values_list("cron", "enabled").get() == ("", False)
    html = staff.get(PAGE).content.decode()
    assert "<strong>disabled</strong>" in html
    assert ">Enable</button>" in html

    change(staff, "enable")

    assert not ScheduleOverride.objects.exists()  # nothing overridden any more
    assert ">Disable</button>" in staff.get(PAGE).content.decode()
    assert audit() == [
        ("schedule_disable", "root", ACTOR, "cron 0 6 * * *: enabled -> disabled"),
        ("schedule_enable", "root", ACTOR, "cron 0 6 * * *: disabled -> enabled"),
    ]


def test_reset_deletes_the_override(staff: Client) -> None:
    ScheduleOverride.objects.create(actor_name=ACTOR, cron="30 7 * * *", enabled=False)

    assert change(staff, "reset").status_code == 302

    assert not ScheduleOverride.objects.exists()
    assert audit() == [
        ("schedule_reset", "root", ACTOR, "cron 30 7 * * * -> 0 6 * * *, was disabled")
    ]
    html = staff.get(PAGE).content.decode()
    assert "<code>0 6 * * *</code>" in html
    assert '<span class="schedule-origin">default</span>' in html
    assert "Reset to default" not in html


def test_run_now_is_audited_with_the_message_id(staff: Client) -> None:
    staff.post(f"{PAGE}{ACTOR}/run/")

    [message] = queued_messages("periodic")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.who, entry.target) == ("run_now", "root", ACTOR)
    assert entry.message_ids == message.message_id


def test_staff_without_run_periodic_see_the_page_read_only(viewer: Client) -> None:
    html = viewer.get(PAGE).content.decode()
    assert "<code>0 6 * * *</code>" in html
    for button in ("Edit cron", "Disable", "Reset to default", "Run now"):
        assert button not in html

    for verb, data in [("edit", {"cron": "* * * * *"}), ("disable", {}), ("reset", {})]:
        assert viewer.post(f"{PAGE}{ACTOR}/{verb}/", data).status_code == 403
    assert not ScheduleOverride.objects.exists()
    assert audit() == []


def test_changes_are_post_only_and_csrf_checked(staff: Client) -> None:
    assert staff.get(f"{PAGE}{ACTOR}/disable/").status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="root"))

    assert strict.post(f"{PAGE}{ACTOR}/disable/").status_code == 403
    assert not ScheduleOverride.objects.exists()


def test_an_unknown_job_or_action_is_404(staff: Client) -> None:
    assert staff.post(f"{PAGE}no_such_job/disable/").status_code == 404
    assert staff.post(f"{PAGE}{ACTOR}/explode/").status_code == 404


def test_the_page_shows_the_last_five_runs_with_links(staff: Client) -> None:
    start = timezone.now() - timedelta(days=7)
    runs = [
        Job.objects.create(
            message_id=str(uuid.uuid4()),
            actor_name=ACTOR,
            queue_name="periodic",
            state=state,
            enqueued_at=start + timedelta(days=n),
        )
        for n, state in enumerate(["failed"] * 2 + ["succeeded", "failed"] + ["succeeded"] * 3)
    ]
    Job.objects.create(  # another job: not this schedule's
        message_id=str(uuid.uuid4()),
        actor_name="watchdog",
        queue_name="periodic",
        enqueued_at=timezone.now(),
    )

    html = staff.get(PAGE).content.decode()

    row = html[html.index(f'id="schedule-{ACTOR}"') :]
    row = row[: row.index("</tr>")]
    shown = [job for job in runs if f'href="/admin/jobs/job/{job.pk}/change/"' in row]
    assert shown == runs[2:]
    assert row.count("succeeded</a>") == 4
    assert row.count("failed</a>") == 1
