"""Web scenarios: the admin job list and dashboard on a large ledger, signup under gunicorn."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.test import Client

from bench import procs
from bench.registry import Context, Row, measured


def _admin_list_ms(client: Client, runs: int) -> float:
    client.get("/admin/jobs/job/")  # warm: templates, query plans
    times = []
    for _ in range(max(runs, 5)):
        started = time.perf_counter()
        response = client.get("/admin/jobs/job/")
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"admin job list answered {response.status_code}")
    return statistics.median(times)


@measured("admin-list", "GET /admin/jobs/job/ as a superuser: large ledger vs 1,000 rows")
def admin_list(context: Context) -> list[Row]:
    large = 50_000 if context.quick else 1_000_000
    env = procs.base_env()  # the bench process's own database
    user = get_user_model().objects.create_superuser("bench-admin", "a@example.com", "x")
    client = Client()
    client.force_login(user)
    procs.manage("filljobs", "--count", "1000", env=env)
    small_ms = _admin_list_ms(client, context.runs)
    started = time.perf_counter()
    procs.manage("filljobs", "--count", str(large - 1000), "--batch", "10000", env=env)
    fill_s = time.perf_counter() - started
    large_ms = _admin_list_ms(client, context.runs)
    ratio = small_ms / large_ms
    return [
        Row(
            f"{large:,} rows",
            f"{large_ms:.1f} ms",
            "1,000 rows",
            f"{small_ms:.1f} ms",
            f"{ratio:.2f}x",
            ">= 0.50x (within 2x)",
            ratio >= 0.5,
        ),
        Row("filljobs", f"{(large - 1000) / fill_s:,.0f} rows/s"),
    ]


def _load(port: int, *, count: int, seconds: float, threads: int = 8) -> tuple[float, list[float]]:
    """POST /api/signup/ ``count`` times from keep-alive clients, or until ``seconds``."""
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    remaining = [count]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < deadline:
            with lock:
                if remaining[0] <= 0:
                    break
                remaining[0] -= 1
            name = uuid.uuid4().hex[:20]
            body = json.dumps(
                {
                    "username": name,
                    "email": f"{name}@example.com",
                    "password": "correct-horse-battery",
                }
            )
            started = time.perf_counter()
            conn.request("POST", "/api/signup/", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status != 201:
                raise RuntimeError(f"signup answered {response.status}")
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)
        conn.close()

    workers = [threading.Thread(target=client) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return len(latencies) / (time.perf_counter() - started), latencies


def _pct(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


@measured(
    "signup", "POST /api/signup/ under gunicorn (2 workers, MD5 hasher), with vs without enqueue"
)
def signup(context: Context) -> list[Row]:
    count, seconds = (200, 10.0) if context.quick else (2_000, 30.0)
    template = procs.template_database(context.workdir)
    ports = {"with": procs.free_port(), "without": procs.free_port()}
    common = {
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": uuid.uuid4().hex * 2,
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "SIGNUP_RATE_LIMIT": "off",
    }
    rates: dict[str, list[float]] = {"with": [], "without": []}
    latencies: dict[str, list[float]] = {"with": [], "without": []}
    envs = {
        name: procs.base_env(
            DATABASE_URL=procs.copy_database(template, context.workdir / f"signup-{name}.sqlite3"),
            BENCH_SIGNUP_ENQUEUE="1" if name == "with" else "0",
            **common,
        )
        for name in ports
    }
    log = context.workdir / "gunicorn.log"
    with (
        procs.gunicorn(port=ports["with"], env=envs["with"], log=log),
        procs.gunicorn(port=ports["without"], env=envs["without"], log=log),
    ):
        for name in ports:
            _load(ports[name], count=20, seconds=5)  # warm up both servers
        for _ in range(context.runs):
            for name in ("without", "with"):  # interleaved
                rate, values = _load(ports[name], count=count, seconds=seconds)
                rates[name].append(rate)
                latencies[name] += values
    with_rate, without_rate = statistics.median(rates["with"]), statistics.median(rates["without"])
    ratio = with_rate / without_rate

    def text(name: str) -> str:
        values = latencies[name]
        return f"p50 {_pct(values, 0.5):.1f} / p99 {_pct(values, 0.99):.1f} ms"

    return [
        Row(
            "with enqueue",
            f"{with_rate:,.0f} req/s",
            "without",
            f"{without_rate:,.0f} req/s",
            f"{ratio:.2f}x",
            ">= 0.95x",
            ratio >= 0.95,
        ),
        Row("with enqueue", text("with"), "without", text("without")),
    ]


def _median_ms(
    call: Callable[[], object], runs: int, before: Callable[[], object] | None = None
) -> float:
    times = []
    for _ in range(max(runs, 5)):
        if before is not None:
            before()
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@measured(
    "dashboard-charts",
    "the dashboard's chart queries on a large ledger vs a plain indexed count of a day",
)
def dashboard_charts(context: Context) -> list[Row]:
    from django.core.cache import cache
    from django.db.models import Q
    from django.utils import timezone

    from jobs.ledger.figures import LAST_DAY, LAST_HOUR, timeline
    from jobs.ledger.references import jobs_naming
    from jobs.models import Job

    large = 50_000 if context.quick else 1_000_000
    missing = large - Job.objects.count()  # admin-list may have filled some already
    if missing > 0:
        procs.manage("filljobs", "--count", str(missing), "--batch", "10000", env=procs.base_env())

    def baseline() -> None:
        since = timezone.now() - timedelta(days=1)
        Job.objects.filter(state="succeeded", finished_at__gte=since).count()

    def charts() -> None:
        timeline(LAST_HOUR)
        timeline(LAST_DAY)

    def search() -> None:
        list(jobs_naming(Job.objects.all(), "auth.user:4242")[:50])
        newest = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
        recent = Job.objects.filter(id__gt=newest - 100_000)
        list(recent.filter(Q(args__icontains="4242") | Q(kwargs__icontains="4242"))[:50])

    base_ms = _median_ms(baseline, context.runs)
    cold_ms = _median_ms(charts, context.runs, before=cache.clear)
    warm_ms = _median_ms(charts, context.runs)
    search_ms = _median_ms(search, context.runs)
    rows = f"{large:,} rows"
    return [
        Row(
            f"charts, cold cache ({rows})",
            f"{cold_ms:.1f} ms",
            "indexed count",
            f"{base_ms:.1f} ms",
        ),
        Row(
            f"charts, finished hours cached ({rows})",
            f"{warm_ms:.1f} ms",
            "indexed count",
            f"{base_ms:.1f} ms",
            f"{warm_ms / base_ms:.1f}x the time",
            "< 250 ms",
            warm_ms < 250,
        ),
        Row(f"job search: subject + newest 100k args ({rows})", f"{search_ms:.1f} ms"),
    ]
