"""What the adversarial review of the console found, each kept from coming back:
a retry that re-runs someone else's bulk action, requests that answered 500, a
secret indexed by ``search_by``, actions missing from or padding the trail."""

from __future__ import annotations

import uuid
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError
from django.test import Client
from django.utils import timezone

from jobs.errors import PermanentJobError
from jobs.ledger import operations
from jobs.ledger.references import subjects_of
from jobs.models import AuditEntry, Job, JobReference, ScheduleOverride
from jobs.scheduling import overrides
from tests.jobs.admin.test_admin import LIST, QUEUE
from tests.jobs.admin.test_bulk_actions import bulk_job, drain, failures, root  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@dramatiq.actor(queue_name=QUEUE, search_by=("password_reset.code", "order.number"))
def reset_password(password_reset: dict[str, Any], order: dict[str, Any]) -> None:
    pass


def clerk_with(client: Client, *codenames: str) -> User:
    clerk = User.objects.create_user("clerk", "c@example.com", "pw", is_staff=True)
    for code in codenames:
        clerk.user_permissions.add(Permission.objects.get(codename=code))
    client.login(username="clerk", password="pw")
    return clerk


def test_a_failed_bulk_action_cannot_be_retried_by_anyone_in_its_owners_name(
    root: Client,  # noqa: F811
    client: Client,
    broker: dramatiq.Broker,
    failures: dict[str, list[Job]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = operations.delete_jobs

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermanentJobError("the database refused the delete")

    monkeypatch.setattr(operations, "delete_jobs", refused)
    root.post("/admin/jobs/job/bulk/delete/?actor=fragile")
    drain(broker)
    assert bulk_job().state == "failed"
    monkeypatch.setattr(operations, "delete_jobs", real)
    entry = AuditEntry.objects.get()
    assert (entry.count, entry.note[:8]) == (0, "stopped:")  # not "done"

    clerk_with(client, "view_job", "retry_job")  # may retry, may not delete
    answer = client.post(
        LIST, {"action": "retry_selected", "_selected_action": [bulk_job().pk]}, follow=True
    )
    drain(broker)

    assert "it is a bulk action: start it again from the list" in answer.content.decode()
    assert Job.objects.filter(actor_name="fragile").count() == 3
    page = client.get(f"{LIST}{bulk_job().pk}/change/").content.decode()
    assert f"{bulk_job().pk}/retry/" not in page  # no Retry button either


def test_a_bulk_job_settles_its_entry_with_what_it_did(
    root: Client,  # noqa: F811
    broker: dramatiq.Broker,
    failures: dict[str, list[Job]],  # noqa: F811
) -> None:
    root.post("/admin/jobs/job/bulk/retry/?actor=fragile")
    drain(broker)

    entry = AuditEntry.objects.get()
    assert entry.count == 3
    assert entry.note.startswith("done: 3 of 3, 0 left alone; bulk job ")
    touched = failures["fragile"][0]
    assert touched.message_id in entry.message_ids.split()
    assert (
        "retry (all matching) by root" in root.get(f"{LIST}{touched.pk}/change/").content.decode()
    )


def test_a_deleted_operators_bulk_job_fails_for_good(
    root: Client,  # noqa: F811
    broker: dramatiq.Broker,
    failures: dict[str, list[Job]],  # noqa: F811
) -> None:
    root.post("/admin/jobs/job/bulk/retry/?actor=fragile")
    User.objects.filter(username="root").delete()
    drain(broker)

    job = bulk_job()
    assert (job.state, job.error_type, job.attempts) == ("failed", "PermanentJobError", 1)


def test_the_bulk_page_needs_the_view_permission_and_refuses_bad_filters_with_no_500(
    root: Client,  # noqa: F811
    client: Client,
) -> None:
    for query in ("nosuchfield=1", "enqueued_at__gte=notadate"):
        for answer in (
            root.get(f"/admin/jobs/job/bulk/retry/?{query}"),
            root.post(f"/admin/jobs/job/bulk/retry/?{query}"),
        ):
            assert (answer.status_code, answer["Location"]) == (302, "/admin/jobs/job/?e=1")
    clerk_with(client, "retry_job")  # no view_job
    assert client.get("/admin/jobs/job/bulk/retry/").status_code == 403


def test_a_number_too_large_for_json_is_searched_as_text(root: Client) -> None:  # noqa: F811
    huge = "9" * 400 + ".5"
    assert root.get(LIST, {"q": f"user_id={huge}"}).status_code == 200
    assert root.get("/admin/jobs/job/bulk/retry/", {"q": f"user_id={huge}"}).status_code == 200


def test_a_cron_longer_than_its_column_is_a_form_error(root: Client) -> None:  # noqa: F811
    text = ",".join(map(str, range(60))) + " * * * *"
    answer = root.post("/admin/jobs/job/schedules/daily_report/edit/", {"cron": text})
    assert answer.status_code == 200
    assert "longer than 100 characters" in answer.content.decode()
    assert not ScheduleOverride.objects.exists()


def test_a_cron_that_never_runs_is_refused() -> None:
    with pytest.raises(overrides.InvalidCron, match="never runs"):
        overrides.parse_cron("0 0 31 4 *")


def test_a_value_under_a_secret_looking_name_is_never_indexed_nor_shown(
    root: Client,  # noqa: F811
    broker: dramatiq.Broker,
) -> None:
    actor = broker.get_actor("reset_password")
    subjects = subjects_of(actor, [{"code": "739122-reset-code"}, {"number": "A-1"}], {})
    assert subjects == ("order.number=A-1",)
    job = Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="an_actor_long_gone",
        queue_name=QUEUE,
        enqueued_at=timezone.now(),
    )
    JobReference.objects.create(job=job, subject="order.number=A-1")
    page = root.get(f"{LIST}{job.pk}/change/").content.decode()
    assert "order.number=a-1:" not in page  # not shown as a broken object reference


def test_the_job_pages_delete_link_is_recorded(root: Client) -> None:  # noqa: F811
    job = Job.objects.create(
        message_id=str(uuid.uuid4()), actor_name="x", queue_name=QUEUE, enqueued_at=timezone.now()
    )
    root.post(f"{LIST}{job.pk}/delete/", {"post": "yes"})

    entry = AuditEntry.objects.get()
    assert (entry.action, entry.message_ids) == ("delete", job.message_id)


def test_nothing_done_is_no_entry(root: Client) -> None:  # noqa: F811
    job = Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="x",
        queue_name=QUEUE,
        state="succeeded",
        enqueued_at=timezone.now(),
    )
    root.post(f"{LIST}{job.pk}/retry/", {"confirmed": "yes"})  # not failed
    root.post(f"{LIST}{job.pk}/cancel/")  # already ended
    root.post(f"/admin/jobs/job/dashboard/queue/{QUEUE}/resume/")  # not paused
    root.post("/admin/jobs/job/schedules/daily_report/reset/")  # not overridden
    root.post("/admin/jobs/job/schedules/daily_report/enable/")  # enabled already

    assert list(AuditEntry.objects.values_list("action", flat=True)) == []


def test_a_scheduler_started_without_its_database_keeps_a_schedule_switched_off(
    root: Client,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root.post("/admin/jobs/job/schedules/daily_report/disable/")

    def down() -> Any:
        raise DatabaseError("the database is down")

    monkeypatch.setattr(overrides, "read_overrides", down)
    reader = overrides.OverrideReader()  # a scheduler that never read the database
    assert reader.read()["daily_report"].enabled is False
