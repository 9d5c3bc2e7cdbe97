"""The admin's workers page: every live worker process and those gone in the last hour.

Each process's host, pid, queues, threads and heartbeat come from its record in
Redis (``jobs.broker.registry``, written by its heartbeat); the jobs it runs
come from the ledger (state ``running``, matched on host and pid). With Redis
unreachable the page still renders the ledger's running jobs and says why the
processes are missing: one Redis call fails within the broker client's socket
timeouts and no other is made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from redis.exceptions import RedisError

from jobs.broker import redis_broker, registry
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.models import Job

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

logger = logging.getLogger(__name__)

# Running rows read from the ledger, newest first: far more than any set of
# workers runs at once; a ledger with more holds stale rows, shown as such.
RUNNING_LIMIT = 500


def duration_text(seconds: float) -> str:
    """``4.2 s``, ``3 min 05 s``, ``2 h 07 min``: seconds always shown below an hour."""
    seconds = max(0.0, seconds)  # another host's clock may be a little ahead
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _moment(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class RunningJob:
    pk: int
    message_id: str
    actor_name: str
    queue_name: str
    host: str
    pid: int | None
    started_at: datetime | None
    running_for: str


@dataclass
class WorkerRow:
    host: str
    pid: int
    broker_id: str
    queues: tuple[str, ...]
    threads: int | None
    started_at: datetime | None
    up_for: str
    last_beat: datetime
    beat_age: str
    status: str  # "live", "stopped" (cleanly) or "lost"
    stale: bool  # live, but no beat for longer than the heartbeat timeout
    jobs: list[RunningJob] = field(default_factory=list)


def _running_jobs(now: float) -> list[RunningJob]:
    rows = (
        Job.objects.filter(state=Job.State.RUNNING)
        .order_by("-id")  # the (state, -id) index
        .only("message_id", "actor_name", "queue_name", "started_at", "worker_host", "worker_pid")
    )
    return [
        RunningJob(
            pk=job.pk,
            message_id=job.message_id,
            actor_name=job.actor_name,
            queue_name=job.queue_name,
            host=job.worker_host,
            pid=job.worker_pid,
            started_at=job.started_at,
            running_for=(
                duration_text(now - job.started_at.timestamp()) if job.started_at else "-"
            ),
        )
        for job in rows[:RUNNING_LIMIT]
    ]


def _row(record: registry.Record, now: float, timeout_s: float) -> WorkerRow:
    beat_age_s = now - record.last_beat_ms / 1000
    up_for_s = now - record.started_at_ms / 1000 if record.started_at_ms is not None else None
    status = "live" if record.present else "stopped" if record.stopped else "lost"
    return WorkerRow(
        host=record.host,
        pid=record.pid,
        broker_id=record.broker_id,
        queues=record.queues,
        threads=record.threads,
        started_at=_moment(record.started_at_ms),
        up_for=duration_text(up_for_s) if up_for_s is not None else "-",
        last_beat=datetime.fromtimestamp(record.last_beat_ms / 1000, tz=UTC),
        beat_age=duration_text(beat_age_s),
        status=status,
        stale=record.present and beat_age_s > timeout_s,
    )


def _place(rows: list[WorkerRow], jobs: list[RunningJob]) -> list[RunningJob]:
    """Put each running job under its process; return those on no process listed.

    A pid can be reused (a restarted container): a job goes to the live process
    of that host and pid, else to the one that beat last.
    """
    owner: dict[tuple[str, int], WorkerRow] = {}
    for row in sorted(rows, key=lambda r: (r.status != "live", -r.last_beat.timestamp())):
        owner.setdefault((row.host, row.pid), row)
    unplaced: list[RunningJob] = []
    for job in sorted(jobs, key=lambda j: j.started_at or datetime.max.replace(tzinfo=UTC)):
        worker = owner.get((job.host, job.pid)) if job.pid is not None else None
        if worker is None:
            unplaced.append(job)
        else:
            worker.jobs.append(job)
    return unplaced


def workers_context() -> dict[str, Any]:
    now = time.time()
    timeout_s = redis_broker().heartbeat_timeout / 1000
    redis_error = None
    records: list[registry.Record] = []
    if recently_unreachable():
        redis_error = "ConnectionError"  # a moment ago: not waited on again
    else:
        try:
            records = registry.recent()
        except (RedisError, OSError) as exc:
            if isinstance(exc, UNREACHABLE):
                note_unreachable(exc)
            # The type only: a connection error's text names the server, and the
            # page needs no more than "unreachable" to be useful.
            logger.warning("Workers page: Redis unreachable", exc_info=True)
            redis_error = type(exc).__name__
    rows = [_row(record, now, timeout_s) for record in records]
    jobs = _running_jobs(now)
    unplaced = _place(rows, jobs)
    live = sorted((r for r in rows if r.status == "live"), key=lambda r: (r.host, r.pid))
    gone = [r for r in rows if r.status != "live"]  # the latest beat first
    return {
        "redis_error": redis_error,
        "live": live,
        "gone": gone,
        "unplaced": unplaced,
        "running_count": len(jobs),
        "running_limit": RUNNING_LIMIT,
        "threads": sum(r.threads or 0 for r in live),
        "stale_count": sum(r.stale for r in live),
        "heartbeat_timeout": duration_text(timeout_s),
        "keep_minutes": registry.KEEP_SECONDS // 60,
        "read_at": datetime.fromtimestamp(now, tz=UTC),
    }


def workers_page(model_admin: ModelAdmin[Job]) -> Callable[[HttpRequest], HttpResponse]:
    """The page's view for ``JobAdmin.get_urls``; it also lists the page in the index.

    Linked where it is mounted: the row in the site's index points at this URL,
    which exists only on the sites that register the job admin.
    """
    link_from_index(model_admin.admin_site)

    def view(request: HttpRequest) -> HttpResponse:
        # Who may see the job list may see which processes run those jobs.
        if not model_admin.has_view_permission(request):
            return HttpResponse(status=403)
        request.current_app = model_admin.admin_site.name
        context = {
            **model_admin.admin_site.each_context(request),
            **workers_context(),
            "title": "Workers",
            "opts": Job._meta,
        }
        return TemplateResponse(request, "admin/jobs/workers.html", context)

    return view


WORKERS_ROW = "Workers"
# The job admin's own pages, listed in the index beside the models.
PAGES = (("Dashboard", "admin:jobs_dashboard"), ("Schedules", "admin:jobs_schedules"),
         (WORKERS_ROW, "admin:jobs_workers"))  # fmt: skip


def link_from_index(site: AdminSite) -> None:
    """List the dashboard, schedules and workers pages in ``site``'s index and nav
    sidebar, in the Jobs block.

    The admin index lists models only, and a reusable app cannot override
    ``admin/index.html`` (django.contrib.admin's own template is found first);
    ``get_app_list`` is where an AdminSite builds that list, so the pages are
    added to the Jobs app's rows there, for whoever sees the job list, and
    every other app's block is left as it was.
    """
    if getattr(site, "_jobs_workers_linked", False):
        return
    build = site.get_app_list

    def get_app_list(request: HttpRequest, *args: Any, **kwargs: Any) -> list[Any]:
        app_list: list[Any] = build(request, *args, **kwargs)
        for app in app_list:
            if app.get("app_label") != Job._meta.app_label:
                continue
            models = app["models"]
            jobs = [m for m in models if m.get("model") is Job and m.get("admin_url")]
            if not jobs:
                continue
            listed = {m.get("object_name") for m in models}
            for name, url_name in PAGES:
                if name in listed:
                    continue
                models.append(
                    {
                        "model": Job,
                        "name": name,
                        "object_name": name,
                        "perms": {"add": False, "change": False, "delete": False, "view": True},
                        "admin_url": reverse(url_name, current_app=site.name),
                        "add_url": None,
                        "view_only": True,
                    }
                )
            models.sort(key=lambda m: m["name"])
        return app_list

    setattr(site, "get_app_list", get_app_list)  # noqa: B010 - mypy refuses assigning a method
    setattr(site, "_jobs_workers_linked", True)  # noqa: B010
