"""The daily report: right figures for a seeded day, produced and mailed once."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from io import StringIO

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import call_command
from django.test import Client
from pytest_django.fixtures import Settings

from jobs.models import DailyReport, Job, JobAttempt
from jobs.scheduling.reports import report_figures
from jobs.tasks import daily_report
from tests.conftest import join

DAY = date(2026, 11, 28)
AT = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def seed() -> None:
    for n in range(3):
        User.objects.create_user(f"u{n}", f"u{n}@example.com", "x", date_joined=AT)
    User.objects.create_user("other-day", "o@example.com", "x", date_joined=AT + timedelta(days=1))

    def job(n: int, actor: str, state: str, duration: int, attempts: int = 1) -> Job:
        return Job.objects.create(
            message_id=f"m{n}",
            actor_name=actor,
            queue_name="q",
            state=state,
            progress=10**12,
            enqueued_at=AT,
            finished_at=AT,
            duration_ms=duration,
            attempts=attempts,
        )

    for n, duration in enumerate([10, 20, 30, 40]):
        job(n, "send_welcome_email", "succeeded", duration)
    job(10, "send_welcome_email", "succeeded", 50, attempts=2)
    failed = job(11, "send_welcome_email", "failed", 5, attempts=3)
    for number in (1, 2, 3):
        JobAttempt.objects.create(
            job=failed,
            number=number,
            finished_at=AT,
            error_type="SMTPServerDisconnected",
            error_message="closed",
        )


@pytest.mark.django_db
def test_the_figures_match_the_seeded_day() -> None:
    seed()

    figures = report_figures(DAY)

    # The product's own figure, registered by accounts/reports.py.
    assert {"key": "signups", "title": "New signups", "value": 3} in figures["sections"]
    assert figures["jobs_failed"] == 1
    [actor] = figures["actors"]
    assert actor["actor"] == "send_welcome_email"
    assert (actor["succeeded"], actor["failed"], actor["retried"]) == (5, 1, 2)
    assert actor["p50_ms"] == 25.0  # median of 5, 10, 20, 30, 40, 50
    assert actor["p95_ms"] == pytest.approx(47.5)
    assert figures["top_failures"] == [
        {"error_type": "SMTPServerDisconnected", "error_message": "closed", "n": 3}
    ]


@pytest.mark.django_db(transaction=True)
def test_the_report_runs_once_under_duplicate_delivery(
    worker: dramatiq.Worker, broker: dramatiq.Broker
) -> None:
    seed()
    message = daily_report.message_with_options(tick="2026-11-29T06:00:00+00:00")

    broker.enqueue(message)
    broker.enqueue(message)
    join("periodic")

    report = DailyReport.objects.get()
    assert report.date == DAY
    assert report.emailed_at is not None
    assert [m.subject for m in mail.outbox] == ["[Django] Daily report 2026-11-28"]
    assert "New signups: 3" in mail.outbox[0].body
    assert mail.outbox[0].alternatives  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_runreport_produces_one_on_demand_and_the_admin_shows_it(
    client: Client, settings: Settings
) -> None:
    seed()
    settings.JOBS_MAIL_RECIPIENTS = ["ops@example.com", "ada@example.com"]
    out = StringIO()

    call_command("runreport", "--date", "2026-11-28", stdout=out)
    call_command("runreport", "--date", "2026-11-28", stdout=out)

    assert DailyReport.objects.count() == 1
    # Who it went to, by the setting that names them (ADMINS may be empty)
    assert "Mailed to 2 recipients (JOBS_MAIL_RECIPIENTS)." in out.getvalue()
    assert "Already mailed earlier." in out.getvalue()
    assert len(mail.outbox) == 1
    User.objects.create_superuser("root", "r@example.com", "pw")
    client.login(username="root", password="pw")
    report = DailyReport.objects.get()
    html = client.get(f"/admin/jobs/dailyreport/{report.pk}/change/").content.decode()
    assert "New signups: 3" in html


@pytest.mark.django_db
def test_runreport_says_it_mailed_no_one_when_no_one_is_named(settings: Settings) -> None:
    settings.JOBS_MAIL_RECIPIENTS = []
    out = StringIO()

    call_command("runreport", "--date", "2026-11-28", stdout=out)

    assert out.getvalue().splitlines()[-1] == "Not mailed: JOBS_MAIL_RECIPIENTS is empty."
    assert mail.outbox == []


def test_runreport_rejects_a_bad_date() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        call_command("runreport", "--date", "28/11/2026")
