"""An operator in headless Chromium: dashboard -> failed job -> retry -> succeeded."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS
from tests.e2e.conftest import screenshot
from tests.jobs.admin.test_admin import QUEUE, fragile, run_queue, switch

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def wait_for_state(message_id: str, state: str, timeout: float = 10) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ledger.flush()
        job = Job.objects.filter(retry_of__message_id=message_id).first()
        if job is not None and job.state == state:
            return job
        time.sleep(0.05)
    raise AssertionError(f"no retry of {message_id} reached {state!r}")


def test_an_operator_retries_a_failed_job_from_the_dashboard(
    live_server: Any, chromium_browser: Any, broker: dramatiq.Broker
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "correct-horse-9")
    switch["broken"] = True
    failed = fragile.send("first try")
    run_queue(broker)
    switch["broken"] = False
    for n in range(3):  # some work waiting, so the dashboard has figures to show
        fragile.send(f"waiting {n}")

    page = chromium_browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/jobs/job/dashboard/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill("correct-horse-9")
    page.get_by_role("button", name="Log in").click()

    page.wait_for_selector("#queues")
    assert QUEUE in page.locator("#queues").inner_text()
    screenshot(page, "admin-dashboard")

    page.locator("#states a[href$='state=failed']").first.click()
    page.get_by_role("link", name=failed.message_id).click()
    page.wait_for_selector("details summary")
    assert "cannot handle first try" in page.content()
    page.locator("details summary").first.click()
    assert page.locator("details pre").first.is_visible()
    screenshot(page, "admin-job-detail")

    page.goto(f"{live_server.url}/admin/jobs/job/?state=failed")
    page.locator(f"tr:has-text('{failed.message_id}') input.action-select").check()
    page.select_option("select[name=action]", "retry_selected")
    page.locator("button[name=index]").click()  # the actions bar's "Go"
    assert "Retried 1 job(s)." in page.locator("ul.messagelist").inner_text()

    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        retry = wait_for_state(failed.message_id, "succeeded")
    finally:
        worker.stop()

    page.goto(f"{live_server.url}/admin/jobs/job/")
    row = page.locator(f"tr:has-text('{retry.message_id}')")
    assert "succeeded" in row.inner_text()
    screenshot(page, "admin-job-list")
    page.close()
