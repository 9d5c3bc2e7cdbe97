"""Acting on every job that matches the list's filters: the count and a
confirmation, then a job of its own that walks the matches in batches."""

from __future__ import annotations

import dramatiq
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobs.ledger import writer as ledger
from jobs.models import AuditEntry, Job
from tests.conftest import join
from tests.jobs.admin.test_admin import LIST, QUEUE, fragile, switch

pytestmark = pytest.mark.django_db(transaction=True)
dramatiq.get_broker().declare_queue("console")  # before any worker: see test_ledger.py


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def sturdy(note: str) -> None:
    if switch["broken"]:
        raise RuntimeError(f"cannot handle {note}")


def drain(broker: dramatiq.Broker) -> None:
    """The bulk job first (alone: a worker on both queues would race it), then the rest."""
    for queues in ({"console"}, {QUEUE}):
        worker = dramatiq.Worker(broker, queues=queues, worker_timeout=50, worker_threads=2)
        worker.start()
        try:
            join(next(iter(queues)))
        finally:
            worker.stop()
        ledger.flush()


@pytest.fixture
def root(client: Client) -> Client:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    return client


@pytest.fixture
def failures(broker: dramatiq.Broker) -> dict[str, list[Job]]:
    switch["broken"] = True
    sent = {"fragile": [fragile.send(str(n)) for n in range(3)], "sturdy": [sturdy.send("s")]}
    drain(broker)
    switch["broken"] = False
    return {
        actor: [Job.objects.get(message_id=m.message_id) for m in messages]
        for actor, messages in sent.items()
    }


def bulk_job() -> Job:
    return Job.objects.get(actor_name="bulk_action")


def test_it_counts_asks_then_retries_every_match_and_nothing_else(
    root: Client, broker: dramatiq.Broker, failures: dict[str, list[Job]]
) -> None:
    filters = {"actor": "fragile", "state__exact": "failed"}
    assert 'id="bulk-bar"' in root.get(LIST, filters).content.decode()

    page = root.get("/admin/jobs/job/bulk/retry/", filters).content.decode()
    assert '<strong id="bulk-count">3</strong> failed job(s)' in page
    assert "actor=fragile, state__exact=failed" in page
    assert Job.objects.filter(retry_of__isnull=False).count() == 0  # asked, not done

    answer = root.post("/admin/jobs/job/bulk/retry/?actor=fragile&state__exact=failed")
    assert answer.status_code == 302
    late = fragile.send("after the confirmation")  # above the ceiling: left alone
    switch["broken"] = True
    drain(broker)

    # retry_of points at the original's message id (to_field), whatever the stubs say
    retried: set[object] = set(
        Job.objects.exclude(retry_of=None).values_list("retry_of_id", flat=True)
    )
    assert retried == {job.message_id for job in failures["fragile"]}
    late_job = Job.objects.get(message_id=late.message_id)
    assert late_job.state == "failed"
    assert late_job.retried_as is None
    assert failures["sturdy"][0].message_id not in retried
    job = bulk_job()
    assert job.state == "succeeded", job.error_message
    assert (job.progress_done, job.progress_total) == (3, 3)
    assert job.return_value == {"action": "retry", "matched": 3, "done": 3, "left_alone": 0}
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.who, entry.count) == ("retry (all matching)", "root", 3)
    assert job.message_id in entry.note


def test_select_all_on_a_list_action_goes_to_the_same_confirmation(
    root: Client, failures: dict[str, list[Job]]
) -> None:
    answer = root.post(
        f"{LIST}?actor=sturdy",
        {
            "action": "cancel_selected",
            "select_across": "1",
            "_selected_action": [failures["sturdy"][0].pk],
        },
    )
    assert answer.status_code == 302
    assert answer["Location"] == "/admin/jobs/job/bulk/cancel/?actor=sturdy"


def test_cancel_and_delete_every_match(root: Client, broker: dramatiq.Broker) -> None:
    switch["broken"] = False  # alone, this test would inherit test_admin's start value
    waiting = [fragile.send(str(n)) for n in range(4)]
    other = sturdy.send("other actor")
    ledger.flush()

    root.post("/admin/jobs/job/bulk/cancel/?actor=fragile")
    drain(broker)

    states = dict(
        Job.objects.filter(actor_name__in=["fragile", "sturdy"]).values_list("message_id", "state")
    )
    assert {states[m.message_id] for m in waiting} == {"cancelled"}
    assert states[other.message_id] == "succeeded"

    root.post("/admin/jobs/job/bulk/delete/?state__exact=cancelled")
    drain(broker)
    assert not Job.objects.filter(state="cancelled").exists()
    assert Job.objects.filter(message_id=other.message_id).exists()


def test_it_needs_the_actions_permission_when_asked_and_when_run(
    client: Client, broker: dramatiq.Broker, failures: dict[str, list[Job]]
) -> None:
    clerk = User.objects.create_user("clerk", "c@example.com", "pw", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.login(username="clerk", password="pw")
    assert client.get("/admin/jobs/job/bulk/retry/").status_code == 403
    assert 'id="bulk-bar"' not in client.get(LIST).content.decode()

    clerk.user_permissions.add(Permission.objects.get(codename="retry_job"))
    assert client.post("/admin/jobs/job/bulk/retry/?actor=fragile").status_code == 302
    clerk.user_permissions.remove(Permission.objects.get(codename="retry_job"))
    drain(broker)

    job = bulk_job()
    assert (job.state, job.error_type) == ("failed", "PermanentJobError")
    assert "clerk may no longer retry jobs" in job.error_message
    assert not Job.objects.exclude(retry_of=None).exists()
