"""An operator in headless Chromium: admin index -> workers page -> a running job's row.

Real rundramatiq processes: two live ones running long jobs, and one SIGKILLed
that the page lists as lost. At 1366 and 1024 px wide, light and dark.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.broker import registry
from jobs.models import Job
from tests.conftest import wait_until
from tests.e2e.conftest import ROOT, screenshot
from tests.examples.tasks import long_job

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_row(
        "sqlite",
        "the workers page reads the worker registry, in Redis",
    ),
]
DOCS_IMAGE = ROOT / "docs/images/admin-workers.png"
READY = "Worker process is ready for action."


def no_horizontal_scroll(page: Any) -> bool:
    root = "document.documentElement"
    return bool(page.evaluate(f"{root}.scrollWidth <= {root}.clientWidth"))


def test_an_operator_finds_the_workers_and_what_they_run(
    live_server: Any, chromium_browser: Any, start_worker: Any
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "correct-horse-9")
    # Given a worker process killed first (its presence key expires 30 s after
    # its last beat; the rest of the setup runs meanwhile)...
    victim = start_worker(processes=1, threads=2, queues=("long",))
    victim.wait_for_log(READY)
    wait_until(lambda: len(registry.recent()) == 1)
    victim.kill()
    killed_at = time.monotonic()
    # ...and two live ones, running two long jobs
    live = start_worker(processes=2, threads=4, queues=("default", "long"))
    live.wait_for_log(READY)
    messages = [long_job.send(f"workers-browser-{n}", 300) for n in range(2)]
    ids = [m.message_id for m in messages]
    wait_until(lambda: Job.objects.filter(message_id__in=ids, state="running").count() == 2, 30)

    page = chromium_browser.new_page(viewport={"width": 1366, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill("correct-horse-9")
    page.get_by_role("button", name="Log in").click()

    # From the index's Jobs block to the page
    page.locator(".app-jobs").get_by_role("link", name="Workers", exact=True).click()
    page.wait_for_selector("#live-workers")
    assert page.url.endswith("/admin/jobs/job/workers/")
    # (the killed one still among them until its presence key expires)
    assert page.locator("#live-workers tr.worker").count() == 3
    assert page.locator("#live-workers ul.running a").count() == 2
    assert page.locator("#no-workers").count() == 0

    wait_until(lambda: time.monotonic() - killed_at > 32, timeout=60, every=0.5)
    page.reload()
    assert page.locator("#live-workers tr.worker").count() == 2
    lost = page.locator('#gone-workers tr[data-status="lost"]')
    assert lost.count() == 1
    assert lost.locator("td").nth(1).inner_text() == str(registry.recent()[-1].pid)
    assert no_horizontal_scroll(page)
    screenshot(page, "admin-workers-1366")
    page.locator("#content").screenshot(path=str(DOCS_IMAGE))
    assert Path(DOCS_IMAGE).stat().st_size > 5_000

    # At 1024 px every column still shows, without a sideways scroll
    page.set_viewport_size({"width": 1024, "height": 800})
    page.reload()
    assert no_horizontal_scroll(page)
    screenshot(page, "admin-workers-1024")
    link = page.locator("#live-workers ul.running a").first
    box = link.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 1024
    page.emulate_media(color_scheme="dark")
    page.reload()
    screenshot(page, "admin-workers-1024-dark")

    # A running job links to its ledger row
    message_id = link.get_attribute("title")
    assert message_id in ids
    link.click()
    page.wait_for_selector(".field-message_id")
    assert message_id in page.locator(".field-message_id").inner_text()
    assert "running" in page.locator(".field-state_coloured").inner_text()
    page.close()
