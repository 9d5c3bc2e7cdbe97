"""POST /api/users/<id>/export/ -> 202 + Location; GET /api/tasks/<id>/ for the requester only."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)


def run_exports(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join("exports")
    finally:
        worker.stop()
    ledger.flush()


@pytest.fixture
def ada() -> User:
    return User.objects.create_user("ada", "ada@example.com", "pw", first_name="Ada")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob", "bob@example.com", "pw")


def login(user: User) -> Client:
    # CSRF checks on, as for a browser session: the endpoint is session-authenticated.
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/accounts/signup/")  # sets the CSRF cookie
    return client


def post_export(client: Client, user_id: int) -> Any:
    token = client.cookies["csrftoken"].value
    return client.post(f"/api/users/{user_id}/export/", HTTP_X_CSRFTOKEN=token)


def test_it_exports_a_user_and_serves_the_result_to_them(
    broker: dramatiq.Broker, ada: User
) -> None:
    client = login(ada)

    response = post_export(client, ada.pk)

    assert response.status_code == 202
    location = response["Location"]
    task_id = response.json()["data"]["id"]
    assert location == f"/api/tasks/{task_id}/"
    waiting = client.get(location).json()["data"]
    assert waiting["status"] == "READY"
    assert "result" not in waiting
    assert "progress" not in waiting  # none reported yet

    run_exports(broker)
    done = client.get(location).json()["data"]

    assert done["status"] == "SUCCESSFUL"
    assert done["task"] == "user_export"
    assert done["attempts"] == 1
    assert done["result"]["email"] == "ada@example.com"
    assert done["result"]["first_name"] == "Ada"
    assert done["enqueued_at"] <= done["started_at"] <= done["finished_at"]
    # The export reports its steps (jobs.runtime.progress): the last one stays.
    assert done["progress"] == {"done": 2, "total": 2, "note": "done"}


def test_no_one_else_reads_the_result(broker: dramatiq.Broker, ada: User, bob: User) -> None:
    task_id = post_export(login(ada), ada.pk).json()["data"]["id"]
    run_exports(broker)

    assert login(ada).get(f"/api/tasks/{task_id}/").status_code == 200
    assert login(bob).get(f"/api/tasks/{task_id}/").status_code == 404
    assert login(ada).get("/api/tasks/no-such-task/").status_code == 404
    assert Client().get(f"/api/tasks/{task_id}/").status_code == 401


def test_only_staff_who_may_view_users_export_someone_else(ada: User, bob: User) -> None:
    assert post_export(login(bob), ada.pk).status_code == 403
    assert post_export(login(bob), 10_000).status_code == 403
    assert Client().post(f"/api/users/{ada.pk}/export/").status_code == 401

    # Staff without auth.view_user: not even the superuser's data
    bob.is_staff = True
    bob.save()
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    assert post_export(login(bob), root.pk).status_code == 403
    assert post_export(login(bob), ada.pk).status_code == 403

    bob.user_permissions.add(Permission.objects.get(codename="view_user"))
    staff = login(User.objects.get(pk=bob.pk))  # a fresh instance: permissions are cached
    assert post_export(staff, ada.pk).status_code == 202
    assert post_export(staff, 10_000).status_code == 404


def test_it_refuses_a_session_post_without_csrf_token(ada: User) -> None:
    client = login(ada)

    assert client.post(f"/api/users/{ada.pk}/export/").status_code == 403


def test_it_reports_the_error_of_a_failed_export(broker: dramatiq.Broker, bob: User) -> None:
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = login(root)
    task_id = post_export(client, bob.pk).json()["data"]["id"]
    bob_id = bob.pk
    bob.delete()  # gone before the worker runs: a permanent failure

    run_exports(broker)
    failed = client.get(f"/api/tasks/{task_id}/").json()["data"]

    assert failed["status"] == "FAILED"
    assert "result" not in failed
    assert failed["error"] == {
        "type": "jobs.errors.PermanentJobError",
        "message": f"jobs.errors.PermanentJobError: user {bob_id} does not exist",
    }


def admin_retry(task_id: str) -> str:
    """Retry the failed task ``task_id`` as an operator does; the retry's id."""
    root = User.objects.create_superuser("operator", "operator@example.com", "pw")
    admin = Client()
    admin.force_login(root)
    job = Job.objects.get(message_id=task_id)
    admin.post("/admin/jobs/job/", {"action": "retry_selected", "_selected_action": [job.pk]})
    return Job.objects.get(message_id=task_id).retried_as or ""


def test_the_requester_sees_the_result_of_an_operators_retry(
    broker: dramatiq.Broker, ada: User, bob: User
) -> None:
    # Given an export that failed for good (its user was gone when it ran)
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = login(root)
    task_id = post_export(client, bob.pk).json()["data"]["id"]
    bob_id = bob.pk
    bob.delete()
    run_exports(broker)
    assert client.get(f"/api/tasks/{task_id}/").json()["data"]["status"] == "FAILED"

    # When an operator fixes the cause and retries it from the admin
    User.objects.create_user("bob", "bob@example.com", "pw", id=bob_id)
    retry_id = admin_retry(task_id)
    run_exports(broker)

    # Then the Location the requester was given shows the retry's success
    done = client.get(f"/api/tasks/{task_id}/").json()["data"]
    assert done["status"] == "SUCCESSFUL"
    assert done["id"] == task_id
    assert done["retried_as"] == retry_id
    assert done["result"]["email"] == "bob@example.com"
    assert done["attempts"] == 2  # the failed one and the retry
    assert "error" not in done
    # and the retry's own id is theirs to read, nobody else's
    retried = client.get(f"/api/tasks/{retry_id}/")
    assert retried.status_code == 200
    assert retried.json()["data"]["status"] == "SUCCESSFUL"
    assert "retried_as" not in retried.json()["data"]
    assert login(ada).get(f"/api/tasks/{task_id}/").status_code == 404
    assert login(ada).get(f"/api/tasks/{retry_id}/").status_code == 404


def test_a_retry_that_fails_again_shows_its_error(broker: dramatiq.Broker, bob: User) -> None:
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = login(root)
    task_id = post_export(client, bob.pk).json()["data"]["id"]
    bob.delete()
    run_exports(broker)

    retry_id = admin_retry(task_id)  # the cause not fixed
    run_exports(broker)
    failed = client.get(f"/api/tasks/{task_id}/").json()["data"]

    assert (failed["status"], failed["retried_as"], failed["attempts"]) == ("FAILED", retry_id, 2)
    assert failed["error"]["type"] == "jobs.errors.PermanentJobError"
