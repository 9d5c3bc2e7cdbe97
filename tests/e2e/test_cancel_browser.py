"""An operator watches a running job's progress on its admin page and stops it
with the Cancel button, in headless Chromium at 1366 px."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User

from jobs.ledger import writer as ledger
from jobs.models import Job
from jobs.runtime import cancellation, progress
from tests.e2e.conftest import screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
QUEUE = "cancel-browser"


@dramatiq.actor(queue_name=QUEUE, actor_name="browser_long_render")
def long_render() -> None:
    progress.report(3, 5, "rendering page 3")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
        cancellation.check()
    progress.report(5, 5, "done")


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=1)
    worker.start()
    yield worker
    worker.stop()


def test_an_operator_sees_progress_and_stops_the_job(
    live_server: Any, wide_page: Any, worker: dramatiq.Worker
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "pw-ops-1")
    message = long_render.send()
    deadline = time.monotonic() + 15
    while not Job.objects.filter(message_id=message.message_id, progress_done=3).exists():
        assert time.monotonic() < deadline, "no progress reported"
        ledger.flush(1)
        time.sleep(0.05)
    job = Job.objects.get(message_id=message.message_id)

    page = wide_page
    page.goto(f"{live_server.url}/admin/jobs/job/{job.pk}/change/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill("pw-ops-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**/admin/jobs/job/{job.pk}/change/")
    assert page.locator(".job-progress").inner_text() == "3 / 5 (60%): rendering page 3"
    assert page.locator("progress").get_attribute("value") == "3"
    screenshot(page, "admin-job-progress")

    clicked = time.monotonic()
    page.get_by_role("button", name="Cancel (stop it)").click()
    page.get_by_text("Asked the running job to stop").wait_for()
    while not Job.objects.filter(pk=job.pk, state="cancelled").exists():
        assert time.monotonic() - clicked < 15, "the job did not stop"
        ledger.flush(1)
        time.sleep(0.05)
    stopped = time.monotonic() - clicked

    page.reload()
    text = page.locator("#content").inner_text()
    assert "asked by ops" in text
    assert "stopped cleanly" in text
    assert page.get_by_role("button", name="Cancel (stop it)").count() == 0
    screenshot(page, "admin-job-cancelled")
    print(f"\nbrowser: click to cancelled in the ledger {stopped:.2f} s")
