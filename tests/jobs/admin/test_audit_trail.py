"""The audit trail: every operator action, from the admin or the CLI, is one entry
(who, when, what, which jobs), listed on the job's page and in its own admin."""

from __future__ import annotations

import getpass
import io

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from jobs.ledger import audit
from jobs.ledger import writer as ledger
from jobs.models import AuditEntry, Job
from tests.jobs.admin.test_admin import LIST, QUEUE, action, fragile, run_queue, switch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(client: Client) -> Client:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    return client


def waiting(note: str) -> Job:
    message = fragile.send(note)
    ledger.flush()
    return Job.objects.get(message_id=message.message_id)


def test_a_list_action_is_one_entry_naming_its_jobs_shown_on_each_job(
    root: Client, broker: dramatiq.Broker
) -> None:
    first, second, other = waiting("a"), waiting("b"), waiting("c")

    action(root, "cancel_selected", [first, second])

    entry = AuditEntry.objects.get()
    assert (entry.who, entry.source, entry.action, entry.count) == ("root", "admin", "cancel", 2)
    assert set(entry.message_ids.split()) == {first.message_id, second.message_id}
    page = root.get(f"{LIST}{first.pk}/change/").content.decode()
    assert "cancel by root (admin) · 2 job(s)" in page
    untouched = root.get(f"{LIST}{other.pk}/change/").content.decode()
    assert "cancel by root" not in untouched
    switch["broken"] = False
    run_queue(broker)


def test_the_job_page_buttons_pausing_and_deleting_are_recorded(
    root: Client, broker: dramatiq.Broker
) -> None:
    switch["broken"] = True
    job = waiting("x")
    run_queue(broker)
    job.refresh_from_db()
    assert job.state == "failed"

    root.post(f"{LIST}{job.pk}/retry/", {"confirmed": "yes"})
    root.post(f"/admin/jobs/job/dashboard/queue/{QUEUE}/pause/")
    root.post(f"/admin/jobs/job/dashboard/queue/{QUEUE}/resume/")
    action(root, "delete_selected_in_batches", [job], confirmed="yes")

    trail = list(AuditEntry.objects.order_by("id").values_list("action", "target", "count"))
    assert trail == [
        ("retry", "", 1),
        ("pause", f"queue {QUEUE}", 0),
        ("resume", f"queue {QUEUE}", 0),
        ("delete", "", 1),
    ]
    assert [e.action for e in audit.naming(job.message_id)] == ["delete", "retry"]
    switch["broken"] = False
    run_queue(broker)  # the retry


def test_the_cli_records_the_operating_system_user(broker: dramatiq.Broker) -> None:
    job = waiting("cli")

    call_command("jobs", "cancel", str(job.pk), "--yes", stdout=io.StringIO(), stderr=io.StringIO())
    call_command("jobs", "status", stdout=io.StringIO())  # a read: no entry

    entry = AuditEntry.objects.get()
    assert (entry.who, entry.source, entry.action, entry.count) == (
        f"os:{getpass.getuser()}",
        "cli",
        "cancel",
        1,
    )
    assert entry.message_ids == job.message_id
    switch["broken"] = False
    run_queue(broker)


def test_the_trail_is_read_only_in_the_admin(root: Client) -> None:
    entry = audit.record("pause", who="root", target="queue emails")
    assert entry is not None

    listing = root.get("/admin/jobs/auditentry/")
    assert listing.status_code == 200
    assert "queue emails" in listing.content.decode()
    assert root.get(f"/admin/jobs/auditentry/{entry.pk}/delete/").status_code == 403
    assert root.get("/admin/jobs/auditentry/add/").status_code == 403
