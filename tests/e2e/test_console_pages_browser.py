"""Every console page in Chromium at an operator's 1366 px and a small 1024 px screen,
light and dark: no sideways scroll, the job list's essential columns in view with
ids on one line, and text that reads against its background.

One live server, one browser and one logged-in session serve every case; the
ledger rows are written once for the module (and flushed after it, as a
transactional test would). ``JOBS_SCREENSHOTS=1`` also writes the pictures the
docs show (docs/images/console-*.png); CI leaves those tracked files alone.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.test.utils import modify_settings

from jobs.ledger import audit, states
from jobs.ledger.writer import TERMINAL
from jobs.models import Job, JobAttempt
from tests.e2e.conftest import ROOT

# The mark makes pytest-django create the test database; the rows themselves are
# the module's (the ``console`` fixture), read by the server's own thread.
pytestmark = [pytest.mark.e2e, pytest.mark.django_db]


class Page(NamedTuple):
    name: str
    path: str  # "{failed}" and "{progress}": the seeded jobs' primary keys
    show: str = ""  # what the screenshot scrolls to (every <details> is opened)


# One line a page.
PAGES = [
    Page("job-list", "/admin/jobs/job/"),
    Page("job-failed", "/admin/jobs/job/{failed}/change/", show="fieldset:has(.field-failures)"),
    Page("job-progress", "/admin/jobs/job/{progress}/change/"),
    Page("dashboard", "/admin/jobs/job/dashboard/"),
    Page("workers", "/admin/jobs/job/workers/"),
    Page("schedules", "/admin/jobs/job/schedules/"),
    Page("admin-index", "/admin/"),
    Page("bulk-retry", "/admin/jobs/job/bulk/retry/?state__exact=failed"),
    Page("audit-trail", "/admin/jobs/auditentry/"),
]
WIDTHS = (1366, 1024)
SCHEMES = ("light", "dark")
HEIGHT = 768
# The job list's columns (header text) an operator needs at any width; at 1366
# px every column shows.
ESSENTIAL_COLUMNS = ("message id", "state", "actor name", "attempts", "enqueued", "duration")
ALL_COLUMNS = (*ESSENTIAL_COLUMNS, "queue name", "progress")
# Large text and UI components (WCAG 1.4.11); body text here is well above it.
MIN_CONTRAST = 3.0
SCREENSHOTS = {(1366, "light"), (1024, "dark")}
IMAGES = ROOT / "docs/images"


@dataclass(frozen=True)
class Console:
    url: str
    ids: dict[str, int]
    storage_state: dict[str, Any] = field(repr=False)  # the session cookie


def seed() -> dict[str, int]:
    """Ledger rows in every state, a failure with a traceback, a job with progress."""
    now = datetime.now(UTC)
    actors = (
        ("send_welcome_email", "emails"),
        ("daily_report", "reports"),
        ("export_user_data", "exports"),
    )
    cycle = [
        states.SUCCEEDED,
        states.FAILED,
        states.RUNNING,
        states.ENQUEUED,
        states.DELAYED,
        states.SKIPPED,
        states.CANCELLED,
    ]
    rows = []
    for n in range(28):
        actor, queue = actors[n % len(actors)]
        state = cycle[n % len(cycle)]
        enqueued = now - timedelta(minutes=40 - n)
        ran = state in (states.SUCCEEDED, states.FAILED, states.RUNNING)
        ended = state in states.TERMINAL_STATES
        rows.append(
            Job(
                message_id=str(uuid.uuid4()),
                actor_name=actor,
                queue_name=queue,
                state=state,
                progress=TERMINAL if ended else 2,
                attempts=1 if ran else 0,
                max_attempts=3,
                args=[n],
                kwargs={},
                enqueued_at=enqueued,
                started_at=enqueued if ran else None,
                finished_at=enqueued + timedelta(milliseconds=1234) if ended and ran else None,
                duration_ms=1234 if ended and ran else None,
                worker_host="worker-1" if ran else "",
            )
        )
        job = rows[-1]
        if state == states.FAILED and n % 2:  # failed for good: the widest attempts cell
            job.error_type = "InvalidPayload"
            job.error_class_path = "jobs.middleware.payloads.InvalidPayload"
        if state == states.RUNNING:  # a progress bar with its note
            job.progress_done, job.progress_total = 1_250 * n, 40_000
            job.progress_note = "rows of table orders"
            job.progress_at = now
        if state == states.SUCCEEDED and n >= len(cycle):  # a retry links its original
            job.retry_of_id = rows[n - len(cycle) + 1].message_id
    Job.objects.bulk_create(rows)
    failed = Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="send_welcome_email",
        queue_name="emails",
        state=states.FAILED,
        progress=TERMINAL,
        attempts=3,
        max_attempts=3,
        args=[7],
        enqueued_at=now - timedelta(minutes=2),
        started_at=now - timedelta(minutes=1),
        finished_at=now - timedelta(seconds=59),
        duration_ms=812,
        worker_host="worker-1",
        worker_pid=4242,
        error_type="SMTPServerDisconnected",
        error_message="Connection unexpectedly closed",
        traceback=TRACEBACK,
    )
    for number in (1, 2, 3):
        JobAttempt.objects.create(
            job=failed,
            number=number,
            finished_at=now - timedelta(seconds=60 - number),
            duration_ms=800 + number,
            error_type="SMTPServerDisconnected",
            error_message="Connection unexpectedly closed",
            traceback=TRACEBACK,
            worker_host="worker-1",
        )
    progress = Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="export_user_data",
        queue_name="exports",
        state=states.RUNNING,
        progress=3,
        attempts=1,
        max_attempts=3,
        args=[11],
        enqueued_at=now - timedelta(seconds=30),
        started_at=now - timedelta(seconds=29),
        worker_host="worker-2",
        worker_pid=4343,
        progress_done=3_200,
        progress_total=5_000,
        progress_note="rows of table orders",
        progress_at=now,
    )
    # Operator actions naming the failed job: its page's "operator actions" and
    # the audit list have rows to lay out.
    audit.record("retry", who="ops", message_ids=[failed.message_id], count=1)
    audit.record(
        "retry (all matching)",
        who="ops",
        target="actor=send_welcome_email, state__exact=failed",
        count=1_204,
        note="bulk job 5f0c2d1e-0b7a-4d0e-9d43-6f2f1b8e9a10",
    )
    audit.record("pause", who="os:deploy", source="cli", target="queue emails", count=0)
    return {"failed": failed.pk, "progress": progress.pk}


TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/.venv/lib/python3.11/site-packages/dramatiq/worker.py", line 518, in process
    res = actor(*message.args, **message.kwargs)
  File "/srv/app/accounts/tasks.py", line 31, in send_welcome_email
    connection.send_messages([email])
  File "/usr/lib/python3.11/smtplib.py", line 405, in getreply
    raise SMTPServerDisconnected("Connection unexpectedly closed")
smtplib.SMTPServerDisconnected: Connection unexpectedly closed
"""


@pytest.fixture(scope="module")
def console(
    django_db_setup: None, django_db_blocker: Any, chromium_browser: Any
) -> Iterator[Console]:
    """A live server on the seeded ledger, and a superuser's session cookie."""
    from pytest_django.live_server_helper import LiveServer

    # The server's thread reads the database for the whole module: unblocked
    # here, not per test (a transactional test would flush the rows after each).
    with django_db_blocker.unblock():
        ids = seed()
        user = User.objects.create_superuser("ops", "ops@example.com", "pw-ops-1")
        client = Client()
        client.force_login(user)
        session = client.cookies["sessionid"].value
        server = LiveServer("localhost")
        try:
            with modify_settings(ALLOWED_HOSTS={"append": "localhost"}):
                cookie = {"name": "sessionid", "value": session, "url": server.url}
                yield Console(server.url, ids, {"cookies": [cookie], "origins": []})
        finally:
            server.stop()
            call_command("flush", verbosity=0, interactive=False)


@pytest.fixture(scope="module")
def contexts(chromium_browser: Any, console: Console) -> Iterator[dict[str, Any]]:
    """One browser context per colour scheme, logged in; tests size the viewport."""
    made = {
        scheme: chromium_browser.new_context(
            viewport={"width": WIDTHS[0], "height": HEIGHT},
            color_scheme=scheme,
            storage_state=console.storage_state,
        )
        for scheme in SCHEMES
    }
    yield made
    for context in made.values():
        context.close()


# Text whose contrast with the background it sits on is below MIN_CONTRAST:
# every visible element of #content with text of its own, its background the
# first opaque one found walking up (semi-transparent ones composited).
LOW_CONTRAST_JS = """
([selector, minimum]) => {
  const parse = (c) => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const over = (top, under) => {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat([1]);
  };
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (const layer of layers.reverse()) bg = over(layer, bg);
    return bg;
  };
  const ratio = (a, b) => {
    const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const bad = [];
  for (const el of document.querySelectorAll(selector)) {
    const ownText = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    if (!ownText || style.visibility === 'hidden' || box.width === 0 || box.height === 0) continue;
    const bg = background(el);
    const r = ratio(over(parse(style.color), bg), bg);
    if (r < minimum) {
      const text = el.textContent.trim().slice(0, 30);
      bad.push(`${el.tagName.toLowerCase()}.${el.className || '-'} "${text}" ${style.color}`
        + ` on rgb(${bg.slice(0, 3).map(Math.round)}): ${r.toFixed(2)}:1`);
    }
  }
  return bad;
}
"""

# Text that a page's object-tools buttons (Dashboard, Workers, Retry...) sit on:
# they float at the top right, and land on whatever text comes first.
COVERED_TEXT_JS = """
() => {
  const tools = [...document.querySelectorAll('#content .object-tools :is(a, button)')]
    .filter((t) => t.getBoundingClientRect().width > 0);
  const hits = new Set();
  const content = document.querySelector('#content');
  const walker = document.createTreeWalker(content, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    range.selectNodeContents(node);
    const lines = [...range.getClientRects()].filter((r) => r.width > 0);
    for (const tool of tools) {
      if (tool.contains(node)) continue;
      const t = tool.getBoundingClientRect();
      const hit = (r) =>
        r.left < t.right && r.right > t.left && r.top < t.bottom && r.bottom > t.top;
      if (lines.some(hit)) {
        hits.add(`"${tool.innerText.trim()}" on "${node.textContent.trim().slice(0, 40)}"`);
      }
    }
  }
  return [...hits];
}
"""

# Where each job list column's header cell ends (px from the left, by header
# text; None when hidden), and where the visible part of the table ends: the
# viewport's edge, or nearer, the edge of a box the table scrolls inside.
COLUMNS_JS = """
() => {
  const table = document.querySelector('#result_list');
  let edge = window.innerWidth;
  for (let e = table.parentElement; e; e = e.parentElement) {
    if (getComputedStyle(e).overflowX !== 'visible') {
      edge = Math.min(edge, e.getBoundingClientRect().left + e.clientLeft + e.clientWidth);
    }
  }
  const rights = {};
  for (const th of table.querySelectorAll('thead th')) {
    const box = th.getBoundingClientRect();
    rights[th.innerText.trim().toLowerCase()] = box.width > 0 ? box.right : null;
  }
  return {edge, rights};
}
"""

# A message id cell's link: how many lines it takes, and the title it carries.
ID_CELL_JS = """
() => {
  const link = document.querySelector('#result_list tbody tr th a');
  const lineHeight = parseFloat(getComputedStyle(link.parentElement).lineHeight);
  const titled = link.querySelector('[title]');
  return {
    lines: link.getBoundingClientRect().height / lineHeight,
    title: titled ? titled.title : link.title,
  };
}
"""


def overflow(page: Any) -> tuple[int, int]:
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    return int(width), int(inner)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("console_page", PAGES, ids=[p.name for p in PAGES])
def test_the_console_page_fits_and_reads(
    console: Console, contexts: dict[str, Any], console_page: Page, width: int, scheme: str
) -> None:
    name, path = console_page.name, console_page.path
    page = contexts[scheme].new_page()
    try:
        page.set_default_timeout(10_000)
        page.set_viewport_size({"width": width, "height": HEIGHT})
        response = page.goto(console.url + path.format(**console.ids))
        assert response is not None
        assert response.status == 200, f"{path} answered {response.status}"
        assert "/login/" not in page.url
        # Open tracebacks are what an operator reads; they must fit too.
        page.evaluate("document.querySelectorAll('#content details').forEach((d) => d.open = true)")

        scroll_width, inner = overflow(page)
        assert scroll_width <= inner + 1, (
            f"{name} at {width} px scrolls sideways: {scroll_width} px wide in {inner}"
        )
        covered = page.evaluate(COVERED_TEXT_JS)
        assert covered == [], f"{name} at {width} px: buttons over text: {covered}"
        low = page.evaluate(LOW_CONTRAST_JS, ["#content *", MIN_CONTRAST])
        assert low == [], f"{name} at {width} px, {scheme}: text below {MIN_CONTRAST}:1: {low}"

        if name == "job-list":
            columns = page.evaluate(COLUMNS_JS)
            edge, rights = min(columns["edge"], width), columns["rights"]
            wanted = ALL_COLUMNS if width >= 1366 else ESSENTIAL_COLUMNS
            out = {c: rights.get(c, "missing") for c in wanted}
            out = {c: r for c, r in out.items() if r is None or r == "missing" or r > edge + 1}
            cell = page.evaluate(ID_CELL_JS)
            # Both in one message: a failing layout usually fails both.
            assert (out, cell["lines"] < 2) == ({}, True), (
                f"job list at {width} px: columns past the visible {edge:.0f} px: {out}; "
                f"a message id takes {cell['lines']:.1f} lines"
            )
            assert re.fullmatch(r"[0-9a-f-]{36}", cell["title"]), "the full id is in the title"
            assert page.locator("#result_list .job-state").count() > 0

        if (width, scheme) in SCREENSHOTS and os.environ.get("JOBS_SCREENSHOTS") == "1":
            IMAGES.mkdir(parents=True, exist_ok=True)
            if console_page.show:
                page.locator(console_page.show).first.evaluate("e => e.scrollIntoView()")
            page.screenshot(path=str(IMAGES / f"console-{name}-{width}-{scheme}.png"))
    finally:
        page.close()
