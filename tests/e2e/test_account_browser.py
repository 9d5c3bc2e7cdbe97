"""A person signs up, logs back in and downloads their data, in headless Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User

from jobs.consistency.locks import redis_lock
from tests.e2e.conftest import screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-9"


@pytest.fixture
def export_worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    """A real worker on the exports queue, running while the person clicks."""
    worker = dramatiq.Worker(broker, queues={"exports"}, worker_timeout=50, worker_threads=2)
    worker.start()
    yield worker
    worker.stop()


def test_a_person_signs_up_logs_in_and_downloads_their_export(
    live_server: Any, page: Any, export_worker: dramatiq.Worker
) -> None:
    page.set_default_timeout(15_000)
    # Signs up
    page.goto(f"{live_server.url}/accounts/signup/")
    page.get_by_label("Username", exact=True).fill("grace")
    page.get_by_label("Email", exact=True).fill("grace@example.com")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password confirmation").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.wait_for_url("**/accounts/signup/done/")

    # Follows the link to log in
    page.get_by_role("link", name="Log in").last.click()
    page.wait_for_url("**/accounts/login/")
    page.get_by_label("Username").fill("grace")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/accounts/")
    assert "grace@example.com" in page.content()

    # Starts the export while another export of the account holds its lock
    # (one export of an account at a time): the page shows the job's progress.
    user_id = User.objects.get(username="grace").pk
    with redis_lock(f"user-export:{user_id}", ttl=60, wait=5):
        page.get_by_role("button", name="Export my data").click()
        page.locator("#export-progress").wait_for(state="visible")
        page.get_by_text("Preparing your export (starting)...").wait_for()
        assert page.locator("#export-progress").get_attribute("max") == "2"
        screenshot(page, "account-export-progress")
    # ... and then finish, without reloading
    download_link = page.get_by_role("link", name="Download the export (JSON)")
    download_link.wait_for(state="visible")
    assert page.locator("#export-progress").is_hidden()
    assert page.locator("#export-status").inner_text() == "Your export is ready."
    screenshot(page, "account-export-ready")

    with page.expect_download() as downloading:
        download_link.click()
    exported = json.loads(Path(downloading.value.path()).read_text())
    assert exported["username"] == "grace"
    assert exported["email"] == "grace@example.com"

    # A reload shows the latest export's state again
    page.reload()
    download_link.wait_for(state="visible")

    # Logs out
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/accounts/login/")
