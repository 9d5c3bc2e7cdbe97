"""The job list refreshes itself in Chromium, and holds still while rows are selected."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User

from jobs.ledger import writer as ledger
from tests.e2e.conftest import screenshot

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_row(
        "sqlite",
        "the refresh in the browser; the list queries run on both databases elsewhere",
    ),
]
QUEUE = "live-test"


@dramatiq.actor(queue_name=QUEUE, actor_name="live_refresh_job")
def live_job(n: int) -> None:
    pass


def test_the_job_list_shows_new_jobs_without_a_reload_unless_rows_are_selected(
    live_server: Any, wide_page: Any, broker: dramatiq.Broker
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "pw-ops-1")
    first = live_job.send(1)
    ledger.flush()
    page = wide_page
    page.goto(f"{live_server.url}/admin/jobs/job/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill("pw-ops-1")
    page.get_by_role("button", name="Log in").click()
    page.get_by_text(first.message_id).wait_for()
    assert "Live: on, every 5 s." in page.locator(".jobs-live").inner_text()

    # A job sent now appears within a refresh (5 s), the page not reloaded.
    page.evaluate("window.notReloaded = true")
    sent = time.monotonic()
    second = live_job.send(2)
    ledger.flush()
    page.get_by_text(second.message_id).wait_for(timeout=12_000)
    print(f"\nlive list: a new job shown {time.monotonic() - sent:.1f} s after it was sent")
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "admin-job-list-live")

    # With a row selected the list holds still: a refresh must not undo it.
    page.locator("input.action-select").first.check()
    third = live_job.send(3)
    ledger.flush()
    page.wait_for_timeout(7_000)
    assert page.get_by_text(third.message_id).count() == 0
    assert page.locator("input.action-select").first.is_checked()
    page.locator("input.action-select").first.uncheck()
    page.get_by_text(third.message_id).wait_for(timeout=12_000)

    # Paused by the operator: no more updates, and it stays paused on the next page.
    page.get_by_role("button", name="Pause live updates").click()
    fourth = live_job.send(4)
    ledger.flush()
    page.wait_for_timeout(7_000)
    assert page.get_by_text(fourth.message_id).count() == 0
    page.reload()
    assert "Live updates paused." in page.locator(".jobs-live").inner_text()
    page.get_by_role("button", name="Resume live updates").click()
