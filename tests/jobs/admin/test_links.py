"""From a user to their jobs and back, through the actor's refers_to declaration."""

from __future__ import annotations

from urllib.parse import urlencode

import dramatiq
import pytest
from django.contrib.auth.models import Group, User
from django.core.checks import run_checks
from django.test import Client

from accounts.tasks import send_welcome_email
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.ledger.references import references, subjects_of
from jobs.models import Job, JobReference
from tests.jobs.admin.test_admin import staff  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/jobs/job/"


@dramatiq.actor(queue_name="links-test", refers_to={"report_id": "jobs.DailyReport"})
def rebuild_report(note: str, report_id: int) -> None:
    pass


# The user is the second reference: every one must lead to the job, not the first only.
@dramatiq.actor(
    queue_name="links-test",
    refers_to={"report_id": "jobs.DailyReport", "user_id": "auth.User"},
)
def mail_report(report_id: int, user_id: int) -> None:
    pass


def welcome_job_for(user: User) -> Job:
    message = send_welcome_email.send(user.pk)
    ledger.flush()
    return Job.objects.get(message_id=message.message_id)


def test_it_records_each_object_an_actor_declares_as_a_jobs_subject() -> None:
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    job = welcome_job_for(ada)
    assert list(job.references.values_list("subject", flat=True)) == [f"auth.user:{ada.pk}"]
    # By keyword, by position after another argument, and not for a non-id value
    assert subjects_of(rebuild_report, ["x"], {"report_id": 3}) == ("jobs.dailyreport:3",)
    assert subjects_of(rebuild_report, ["x", 4], {}) == ("jobs.dailyreport:4",)
    assert references(rebuild_report, ["x", [1, 2]], {}) == []
    # Every declared reference, in order, each once
    assert subjects_of(mail_report, [3, 7], {}) == ("jobs.dailyreport:3", "auth.user:7")


def test_the_user_page_links_to_that_users_jobs_only(staff: Client) -> None:  # noqa: F811
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    bob = User.objects.create_user("bob", "bob@example.com", "pw")
    adas, bobs = welcome_job_for(ada), welcome_job_for(bob)

    page = staff.get(f"/admin/auth/user/{ada.pk}/change/").content.decode()
    link = f'href="{LIST}?subject=auth.user%3A{ada.pk}"'
    assert link in page, page[-3000:]

    listed = staff.get(LIST, {"subject": f"auth.user:{ada.pk}"}).content.decode()
    assert adas.message_id in listed
    assert bobs.message_id not in listed


def test_a_jobs_page_links_to_the_user_its_arguments_name(staff: Client) -> None:  # noqa: F811
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    job = welcome_job_for(ada)

    page = staff.get(f"{LIST}{job.pk}/change/").content.decode()
    assert f'href="/admin/auth/user/{ada.pk}/change/"' in page
    assert f"auth.user:{ada.pk}" in page


def test_a_page_of_an_object_no_actor_names_has_no_jobs_link(staff: Client) -> None:  # noqa: F811
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    group = Group.objects.create(name="ops")
    user_page = staff.get(f"/admin/auth/user/{ada.pk}/change/").content.decode()
    page = staff.get(f"/admin/auth/group/{group.pk}/change/").content.decode()
    assert 'class="jobslink"' in user_page
    assert 'class="jobslink"' not in page


def test_search_finds_an_objects_jobs_by_subject_and_recent_jobs_by_argument(
    staff: Client,  # noqa: F811
) -> None:
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    job = welcome_job_for(ada)
    other = rebuild_report.send("needle-in-args", 1).message_id
    ledger.flush()

    by_subject = staff.get(LIST, {"q": f"auth.user:{ada.pk}"}).content.decode()
    by_text = staff.get(LIST, {"q": "needle-in"}).content.decode()
    assert job.message_id in by_subject
    assert other not in by_subject
    assert other in by_text
    assert job.message_id not in by_text


def test_a_declaration_naming_an_unknown_argument_fails_the_checks() -> None:
    @dramatiq.actor(queue_name="links-test", refers_to={"customer": "nope.Model"})
    def broken_declaration(user_id: int) -> None:
        pass

    try:
        errors = [e for e in run_checks() if e.id == "jobs.E001"]
    finally:
        del dramatiq.get_broker().actors["broken_declaration"]
    messages = " ".join(e.msg for e in errors)
    assert "'customer', not an argument" in messages
    assert "no such model" in messages


def test_each_object_a_job_names_lists_it_and_the_job_links_each(staff: Client) -> None:  # noqa: F811
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    message = mail_report.send(3, ada.pk)
    ledger.flush()
    job = Job.objects.get(message_id=message.message_id)
    job_page = staff.get(f"{LIST}{job.pk}/change/").content.decode()
    user_page = staff.get(f"/admin/auth/user/{ada.pk}/change/").content.decode()

    for subject in ("jobs.dailyreport:3", f"auth.user:{ada.pk}"):
        # From the job to the object's jobs, and from them back to the job
        its_jobs = f"{LIST}?{urlencode({'subject': subject})}"
        assert f'href="{its_jobs}"' in job_page, subject
        assert message.message_id in staff.get(its_jobs).content.decode(), subject
        assert message.message_id in staff.get(LIST, {"q": subject}).content.decode(), subject
    # From the user's page (its "Jobs" link) to the job, and from the job to the user
    assert f'href="{LIST}?subject=auth.user%3A{ada.pk}"' in user_page
    assert f'href="/admin/auth/user/{ada.pk}/change/"' in job_page


def test_an_objects_jobs_are_only_the_jobs_naming_it(staff: Client) -> None:  # noqa: F811
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    bob = User.objects.create_user("bob", "bob@example.com", "pw")
    adas = mail_report.send(3, ada.pk).message_id
    bobs = mail_report.send(4, bob.pk).message_id
    ledger.flush()

    listed = staff.get(LIST, {"subject": f"auth.user:{ada.pk}"}).content.decode()
    report_4 = staff.get(LIST, {"q": "jobs.dailyreport:4"}).content.decode()

    assert adas in listed
    assert bobs not in listed
    assert bobs in report_4
    assert adas not in report_4


def test_a_reference_the_database_would_refuse_is_stored_readable() -> None:
    # Ids may be text (UUID keys); this one holds what PostgreSQL and UTF-8 refuse.
    message = mail_report.send(3, "a\x00b\ud800")  # type: ignore[arg-type]
    ledger.flush()

    stored = JobReference.objects.filter(job__message_id=message.message_id)
    assert sorted(stored.values_list("subject", flat=True)) == [
        "auth.user:a\ufffdb\ufffd",
        "jobs.dailyreport:3",
    ]


def test_a_jobs_references_go_with_it() -> None:
    ada = User.objects.create_user("ada", "ada@example.com", "pw")
    kept = mail_report.send(3, ada.pk).message_id
    gone = mail_report.send(4, ada.pk).message_id
    ledger.flush()

    operations.delete_jobs(Job.objects.filter(message_id=gone))

    assert set(JobReference.objects.values_list("job__message_id", flat=True)) == {kept}
