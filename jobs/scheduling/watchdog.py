"""The watchdog (a periodic job, every minute): ghost jobs, stale locks, stuck queues.

Findings go to the log as warnings with structured fields and to the site admins
by mail, at most one mail per kind of finding per ``WATCHDOG_MAIL_EVERY_MINUTES``
so an incident sends one mail, not one a minute.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.core.mail import mail_admins
from django.utils import timezone
from django_redis import get_redis_connection

from jobs.broker import queues, redis_broker
from jobs.consistency.locks import KEY_PREFIX as LOCK_PREFIX
from jobs.ledger import states
from jobs.ledger.writer import PHASE_ENQUEUED, TERMINAL, with_phase
from jobs.models import Job

logger = logging.getLogger(__name__)
HOST = socket.gethostname()
DEPTH_KEY = "jobs:watchdog:depth:{}"
MAILED_KEY = "jobs:watchdog:mailed:{}"


@dataclass(frozen=True)
class Finding:
    kind: str  # "stalled_job", "lock_without_ttl", "queue_stalled"
    subject: str
    detail: dict[str, Any] = field(default_factory=dict)


def _time_limit_ms(job: Job) -> int:
    limit = job.options.get("time_limit")
    if limit is None and job.actor_name in redis_broker().actors:
        limit = redis_broker().actors[job.actor_name].options.get("time_limit")
    return int(limit or settings.JOBS_TIME_LIMIT_MS)


def _worker_alive(job: Job) -> bool | None:
    """True/False for a worker on this host; None when we cannot tell."""
    if job.worker_host != HOST or job.worker_pid is None:
        return None
    try:
        os.kill(job.worker_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reconcile(job: Job) -> str | None:
    """Bring one ghost "running" job in line with the broker; return what was done."""
    where = (
        queues.locate(job.queue_name, job.redis_message_id) if job.redis_message_id else "pending"
    )
    worker = f"worker {job.worker_host}:{job.worker_pid}"
    # Only the run we looked at: a redelivery may have started since.
    running = Job.objects.filter(
        message_id=job.message_id, state=states.RUNNING, started_at=job.started_at
    )
    if where == "pending":
        # Dramatiq redelivers it once the dead worker's heartbeat is old enough and
        # maintenance runs (forced by the caller): show it as waiting again.
        note = f"{worker} gone while running; redelivering"
        moved = running.update(
            state=states.ENQUEUED,
            # Back to "waiting" for the same Dramatiq attempt index, so the
            # redelivered run's events (same index, later phase) still apply.
            progress=with_phase(job.progress, PHASE_ENQUEUED),
            error_type="WorkerLost",
            error_message=note,
        )
    elif where == "dead":
        note = f"{worker} gone; the broker dead-lettered the message"
        moved = running.update(
            state=states.FAILED, progress=TERMINAL, error_type="WorkerLost", error_message=note
        )
    else:
        # Acked: it finished, but the worker died before its ledger batch was
        # written (successes are not waited for, for throughput).
        note = f"{worker} finished it and was gone before recording it"
        moved = running.update(
            state=states.SUCCEEDED,
            progress=TERMINAL,
            finished_at=timezone.now(),
            error_message=note,
        )
    return note if moved else None


def reconcile_stalled_jobs() -> list[Finding]:
    """Ledger jobs "running" on a dead worker: requeued, failed or succeeded per the broker.

    A worker on this host is known dead when its pid is gone; elsewhere it is
    presumed dead once the job outran its time limit plus ``WATCHDOG_GRACE_S``.
    """
    now = timezone.now()
    grace = timedelta(seconds=settings.WATCHDOG_GRACE_S)
    findings = []
    candidates = Job.objects.filter(state=states.RUNNING, started_at__lt=now - grace)
    for job in candidates.only(
        "message_id",
        "actor_name",
        "queue_name",
        "options",
        "started_at",
        "worker_host",
        "worker_pid",
        "attempts",
        "progress",
        "redis_message_id",
    ):
        assert job.started_at is not None
        alive = _worker_alive(job)
        limit = timedelta(milliseconds=_time_limit_ms(job))
        if alive is True or (alive is None and job.started_at > now - limit - grace):
            continue
        note = _reconcile(job)
        if note:
            findings.append(
                Finding("stalled_job", job.message_id, {"actor": job.actor_name, "note": note})
            )
    if findings:
        queues.force_maintenance()
    return findings


def stale_locks() -> list[Finding]:
    """Locks with no TTL (they would never expire) or held longer than the threshold."""
    client = get_redis_connection("default")
    findings = []
    max_age_ms = settings.WATCHDOG_LOCK_MAX_AGE_S * 1000
    for raw_key in client.scan_iter(match=f"{LOCK_PREFIX}*", count=500):
        key = raw_key.decode()
        if key.endswith(":fence"):
            continue
        ttl_ms = client.pttl(key)
        holder = client.get(key)
        holder_text = holder.decode(errors="replace") if holder else None
        if ttl_ms == -1:
            findings.append(Finding("lock_without_ttl", key, {"holder": holder_text}))
        elif ttl_ms > max_age_ms:
            findings.append(
                Finding("lock_held_too_long", key, {"holder": holder_text, "ttl_ms": ttl_ms})
            )
    return findings


def stuck_queues() -> list[Finding]:
    """Queues whose depth grew at every check for N minutes with no job finishing."""
    client = redis_broker().client
    minutes = settings.WATCHDOG_QUEUE_STALL_MINUTES
    now = time.time()
    findings = []
    for stat in queues.all_queue_stats():
        key = DEPTH_KEY.format(stat.name)
        client.rpush(key, json.dumps([now, stat.waiting]))
        client.ltrim(key, -(minutes + 1), -1)
        client.expire(key, (minutes + 2) * 60)
        samples = [json.loads(s) for s in client.lrange(key, 0, -1)]
        if len(samples) <= minutes:
            continue
        depths = [depth for _, depth in samples]
        growing = all(later > earlier for earlier, later in pairwise(depths))
        since = timezone.now() - timedelta(minutes=minutes)
        finished = Job.objects.filter(
            queue_name=stat.name, finished_at__gte=since, progress=TERMINAL
        ).exists()
        if growing and not finished and not stat.paused:
            findings.append(
                Finding("queue_stalled", stat.name, {"depths": depths, "minutes": minutes})
            )
    return findings


def alert(findings: list[Finding]) -> int:
    """Log every finding; mail each kind at most once per window. Returns mails sent."""
    client = redis_broker().client
    by_kind: dict[str, list[Finding]] = {}
    for finding in findings:
        logger.warning(
            "watchdog %s: %s %s",
            finding.kind,
            finding.subject,
            json.dumps(finding.detail, default=str),
            extra={"finding": finding.kind, "subject": finding.subject, **finding.detail},
        )
        by_kind.setdefault(finding.kind, []).append(finding)
    sent = 0
    window = settings.WATCHDOG_MAIL_EVERY_MINUTES * 60
    for kind, items in by_kind.items():
        if not client.set(MAILED_KEY.format(kind), "1", nx=True, ex=window):
            continue
        lines = [f"- {f.subject}: {json.dumps(f.detail, default=str)}" for f in items]
        mail_admins(
            f"Watchdog: {len(items)} {kind.replace('_', ' ')}",
            "\n".join(lines) + f"\n\nNo further mail about this for {window // 60} minutes.",
            fail_silently=True,
        )
        sent += 1
    return sent


def run_watchdog() -> list[Finding]:
    findings = reconcile_stalled_jobs() + stale_locks() + stuck_queues()
    alert(findings)
    return findings
