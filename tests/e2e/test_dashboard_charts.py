"""An operator in headless Chromium reads the dashboard's charts after a mix of jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User

from tests.e2e.conftest import ROOT, screenshot
from tests.jobs.ledger.test_timeline import clear_of_a_minute_boundary, run_mix

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
DOCS_IMAGE = ROOT / "docs/images/admin-dashboard-charts.png"


def bar_total(page: Any, chart: str, series: str) -> int:
    values = page.eval_on_selector_all(
        f"#{chart} rect[data-series='{series}']", "rects => rects.map(r => r.dataset.value)"
    )
    return sum(int(v) for v in values)


def test_the_dashboard_charts_show_succeeded_failed_and_retried_jobs(
    live_server: Any, chromium_browser: Any, broker: dramatiq.Broker
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "correct-horse-9")
    # The p95 line below has one point per minute that saw jobs finish.
    clear_of_a_minute_boundary()
    run_mix(broker, succeed=6, fail=2, retry=3)

    page = chromium_browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/jobs/job/dashboard/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill("correct-horse-9")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_selector("#finished-per-minute svg")

    for chart in ("finished-per-minute", "finished-per-hour"):
        assert bar_total(page, chart, "succeeded") == 6
        assert bar_total(page, chart, "failed") == 2
        assert bar_total(page, chart, "retried") == 3
        assert bar_total(page, chart, "skipped") == 0
        # The bars are drawn, not only present in the markup
        box = page.locator(f"#{chart} rect[data-series='failed']").first.bounding_box()
        assert box is not None
        assert box["height"] > 1
    legend = page.locator("#finished-per-minute .legend").inner_text()
    assert "failed 2" in legend
    assert "retried 3" in legend
    line = page.locator("#p95-per-minute g[data-series='outcome']")
    assert line.get_attribute("data-points") == "1"
    # Text follows the admin theme's colour, not a fixed black
    tick_fill = page.eval_on_selector("#finished-per-minute .tick", "t => getComputedStyle(t).fill")
    body_fg = page.evaluate(
        "getComputedStyle(document.documentElement).getPropertyValue('--body-quiet-color')"
    )
    assert tick_fill
    assert body_fg.strip()

    screenshot(page, "admin-dashboard-charts")
    page.locator(".charts").first.screenshot(path=str(DOCS_IMAGE))
    assert Path(DOCS_IMAGE).stat().st_size > 5_000

    page.emulate_media(color_scheme="dark")
    page.reload()
    page.wait_for_selector("#finished-per-minute svg")
    dark_tick = page.eval_on_selector("#finished-per-minute .tick", "t => getComputedStyle(t).fill")
    assert dark_tick != tick_fill  # the axis text changed with the theme
    screenshot(page, "admin-dashboard-charts-dark")
    page.close()
