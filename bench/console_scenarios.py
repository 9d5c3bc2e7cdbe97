"""Console scenario: every page of the job console and its live refresh on a large
PostgreSQL ledger (issue 32: each within 200 ms at p95 on 1,000,000 rows).

The bench process's own database is SQLite, so the pages are timed in a child
process whose ``DATABASE_URL`` names a fresh database of the bench's PostgreSQL
cluster (bench.postgres), filled with ``manage.py filljobs`` and then settled
(vacuumed, analysed, checkpointed) as a table that stopped growing is. The child
times Django's test Client as a logged-in superuser (the whole request: the
admin's middleware, the queries, the template) and prints its figures as JSON.

A live refresh is what jobs/static/jobs/live.js asks every 5 s of a page with a
``data-live-region``: the same URL with ``X-Requested-With: jobs-live``, from
which it takes the region by id; each answer is checked to hold that region.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench import procs
from bench.registry import Context, Row, measured

TARGET_MS = 200.0
ARGUMENT_TERM = "user_id=777"
LIST = "/admin/jobs/job/"


@dataclass(frozen=True)
class Page:
    label: str
    path: str
    live_region: str | None = None  # the id live.js refreshes, if the page has one


def _pages(*, message_id: str, job_id: int) -> list[Page]:
    return [
        Page("job list", LIST, "live-results"),
        Page("list: state failed", f"{LIST}?state__exact=failed", "live-results"),
        Page("list: actor", f"{LIST}?actor=send_welcome_email", "live-results"),
        Page("search: subject auth.user:7", f"{LIST}?q=auth.user:7", "live-results"),
        Page("search: message id", f"{LIST}?q={message_id}", "live-results"),
        Page(f"search: {ARGUMENT_TERM}", f"{LIST}?q={ARGUMENT_TERM}", "live-results"),
        Page("job page", f"{LIST}{job_id}/change/"),
        Page("dashboard", f"{LIST}dashboard/", "live-dashboard"),
        Page("workers", f"{LIST}workers/", "workers-page"),
        Page("schedules", f"{LIST}schedules/"),
    ]


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: of 20 requests, p95 is the 19th fastest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


# --- the child process: Django set up on the PostgreSQL database ---------------


def _timed(client: Any, page: Page, requests: int, *, live: bool) -> list[float]:
    headers = {"HTTP_X_REQUESTED_WITH": "jobs-live"} if live else {}
    times = []
    for attempt in range(requests + 1):  # the first warms templates and plans
        started = time.perf_counter()
        response = client.get(page.path, **headers)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"{page.path} answered {response.status_code}")
        if live and f'id="{page.live_region}"' not in response.content.decode():
            raise RuntimeError(f"{page.path}'s live answer has no #{page.live_region}")
        if attempt:
            times.append(elapsed)
    return times


def _argument_search(client: Any) -> dict[str, Any]:
    """The ledger queries the argument search's page runs (its first request,
    before any timing), each with its plan as PostgreSQL runs it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"{LIST}?q={ARGUMENT_TERM}")
    if response.status_code != 200:
        raise RuntimeError(f"the argument search answered {response.status_code}")
    statements = list(
        dict.fromkeys(
            query["sql"]
            for query in captured.captured_queries
            if query["sql"].startswith("SELECT") and '"jobs_job' in query["sql"]
        )
    )
    plans = []
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return {"statements": statements, "plans": plans}


def serve(requests: int) -> None:
    """Time every page ``requests`` times; print the figures as one JSON object."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from jobs.models import Job

    user = get_user_model().objects.create_superuser("bench-admin", "a@example.com", "x")
    client = Client()
    client.force_login(user)
    low, high = (
        Job.objects.order_by("id").values_list("id", flat=True)[0],
        Job.objects.latest("id").id,
    )
    middle = (low + high) // 2
    failed = Job.objects.filter(state="failed", id__lte=middle).order_by("-id").first()
    assert failed is not None
    message_id = (
        Job.objects.filter(id__gte=middle).order_by("id").values_list("message_id", flat=True)[0]
    )
    pages = _pages(message_id=message_id, job_id=failed.id)
    search = _argument_search(client)
    figures = []
    for page in pages:
        for live in (False, True) if page.live_region else (False,):
            times = _timed(client, page, requests, live=live)
            figures.append({"label": page.label, "path": page.path, "live": live, "ms": times})
    print(json.dumps({"pages": figures, "argument_search": search}))


# --- the bench process ------------------------------------------------------


def _settle(database_url: str) -> None:
    """What autovacuum and the checkpointer leave behind a table that stopped
    growing: statistics, the visibility map (index-only scans) and no backlog of
    dirty pages whose writing would land in the first page timed."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
        connection.execute("CHECKPOINT")


def _child(database_url: str, requests: int) -> dict[str, Any]:
    code = "\n".join(
        [
            "import django",
            "django.setup()",
            "from bench import console_scenarios",
            f"console_scenarios.serve({requests})",
        ]
    )
    done = subprocess.run(
        [procs.PYTHON, "-c", code],
        cwd=procs.ROOT,
        env=procs.base_env(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"admin-pages: the timing process failed:\n{done.stderr[-5000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@measured(
    "admin-pages",
    "every job console page and live refresh as a superuser, p50/p95, on a 1,000,000-row"
    " ledger on PostgreSQL (the bench's own cluster)",
)
def admin_pages(context: Context) -> list[Row]:
    from bench import postgres

    reason = postgres.missing()
    if reason:
        print(f"admin-pages: skipped: {reason}", file=sys.stderr, flush=True)
        return [Row("console pages (PostgreSQL)", f"skipped: {reason}")]
    count, requests = (20_000, 5) if context.quick else (1_000_000, 20)
    with postgres.cluster(context.workdir) as cluster, cluster.fresh_database("pages") as url:
        started = time.perf_counter()
        env = procs.base_env(DATABASE_URL=url)
        procs.manage("filljobs", "--count", str(count), "--batch", "10000", env=env)
        fill_s = time.perf_counter() - started
        _settle(url)
        result = _child(url, requests)
    return [
        *_page_rows(result, count=count, requests=requests),
        _plan_row(result["argument_search"]),
        Row(f"filljobs on PostgreSQL ({count:,} rows)", f"{count / fill_s:,.0f} rows/s"),
    ]


def _page_rows(result: dict[str, Any], *, count: int, requests: int) -> list[Row]:
    rows = []
    for page in result["pages"]:
        p50, p95 = _percentile(page["ms"], 0.5), _percentile(page["ms"], 0.95)
        rows.append(
            Row(
                f"{'live refresh' if page['live'] else 'page'}: {page['label']}",
                f"p50 {p50:.1f} / p95 {p95:.1f} ms",
                target=f"p95 <= {TARGET_MS:.0f} ms ({count:,} rows, {requests} requests)",
                ok=p95 <= TARGET_MS,
            )
        )
    return rows


# An index named in a plan line ("Index Scan using X on T", "Bitmap Index Scan on X").
_INDEX = re.compile(r"(?:Scan(?: Backward)? using|Bitmap Index Scan on) (\w+)")
_SEQ_SCAN = re.compile(r"Seq Scan on (jobs_\w+)")


def _plan_row(search: dict[str, Any]) -> Row:
    """The plans printed, and a row that fails when one reads a ledger table whole."""
    print(f"admin-pages: EXPLAIN ANALYZE of the ledger queries of ?q={ARGUMENT_TERM}:", flush=True)
    for statement, plan in zip(search["statements"], search["plans"], strict=True):
        print(f"\n{statement}\n{plan}\n", flush=True)
    text = "\n".join(search["plans"])
    indexes = sorted(set(_INDEX.findall(text)))
    scanned = sorted(set(_SEQ_SCAN.findall(text)))
    return Row(
        f"plan: {ARGUMENT_TERM}",
        f"{', '.join(indexes) or 'no index'}; seq scan: {', '.join(scanned) or 'none'}",
        target="no seq scan of a ledger table",
        ok=bool(search["plans"]) and not scanned,
    )
