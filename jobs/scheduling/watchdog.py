"""The watchdog (a periodic job, every minute): ghost jobs, stale locks, stuck queues.

Findings go to the log as warnings with structured fields and by mail to
``JOBS_MAIL_RECIPIENTS``, at most one mail per kind of finding per
``JOBS_WATCHDOG_MAIL_EVERY_MINUTES`` so an incident sends one mail, not one a minute.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from django_redis import get_redis_connection

from jobs.broker import queues, redis_broker, workers
from jobs.conf import jobs_settings
from jobs.consistency.locks import KEY_PREFIX as LOCK_PREFIX
from jobs.consistency.locks import held_since_ms
from jobs.ledger import intake, states
from jobs.ledger.writer import (
    PHASE_DELAYED,
    PHASE_ENQUEUED,
    PHASE_GUESSED,
    TERMINAL,
    with_phase,
)
from jobs.models import EffectRecord, Job
from jobs.scheduling.operators import mail_operators

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
    return int(limit or jobs_settings.JOBS_TIME_LIMIT_MS)


def _worker_alive(job: Job) -> bool | None:
    """Whether the worker that ran ``job`` lives; None when we cannot tell.

    On this host the pid answers; elsewhere the worker's presence key, which its
    heartbeat thread refreshes every few seconds (``jobs.broker.workers``).
    """
    if job.worker_pid is None:
        return None
    if job.worker_host == HOST:
        try:
            os.kill(job.worker_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        return workers.presence_exists(job.worker_host, job.worker_pid)
    except Exception:  # Redis unreachable: say nothing rather than guess
        return None


def _effect_done(job: Job) -> bool:
    done = EffectRecord.objects.filter(job_id=job.message_id, state=EffectRecord.State.DONE)
    return done.exists()


def _where(job: Job) -> str:
    if not job.redis_message_id:
        return "pending"
    return queues.locate(job.queue_name, job.redis_message_id)


def _same(job: Job) -> QuerySet[Job]:
    """Only the row we looked at: a redelivery or a late write may have moved it since."""
    return Job.objects.filter(
        message_id=job.message_id,
        state=job.state,
        progress=job.progress,
        started_at=job.started_at,
        redis_message_id=job.redis_message_id,
    )


def _reconcile(job: Job, where: str) -> str | None:
    """Bring one non-terminal job in line with the broker and its effects.

    Returns what was done, or None when the row needed nothing (or moved on
    while we looked: every update is conditional on the row we read).
    """
    worker = f"worker {job.worker_host}:{job.worker_pid}"
    same = _same(job)
    # An end the broker did not confirm is a guess: written at phase 0 of the
    # row's attempt, below every event of that attempt, so the message's own
    # next event (a batch the ledger wrote late, a success written after its
    # worker stopped waiting) replaces it and the ledger converges.
    guess = with_phase(job.progress, PHASE_GUESSED)
    if where == "pending":
        if job.state != states.RUNNING:
            return None  # waiting or delayed in Redis, as the ledger says
        # Dramatiq redelivers it once the dead worker's heartbeat is old enough and
        # maintenance runs (every worker forces one every few seconds): show it
        # as waiting again.
        note = f"{worker} gone while running; redelivering"
        moved = same.update(
            state=states.ENQUEUED,
            # Back to "waiting" for the same Dramatiq attempt index, so the
            # redelivered run's events (same index, later phase) still apply.
            progress=with_phase(job.progress, PHASE_ENQUEUED),
            error_type="WorkerLost",
            error_message=note,
        )
    elif where == "dead":
        # The broker's own verdict: nothing runs a dead-lettered message again.
        note = f"{worker} gone; the broker dead-lettered the message"
        moved = same.update(
            state=states.FAILED, progress=TERMINAL, error_type="WorkerLost", error_message=note
        )
    elif _effect_done(job):
        # Acked, and its idempotent effect is done: it finished, but its end was
        # never written (a write that failed before the ack).
        note = "finished (its effect is done) without its end being recorded"
        moved = same.update(
            state=states.SUCCEEDED,
            progress=guess,
            finished_at=timezone.now(),
            error_message=note,
        )
    else:
        # Acked without a recorded end and with no effect to show for it: a
        # success is never guessed. Failed, so it is seen and can be retried.
        note = "left the broker without a recorded outcome; retry it if it did not run"
        moved = same.update(
            state=states.FAILED, progress=guess, error_type="WorkerLost", error_message=note
        )
    return note if moved else None


def _moved(jobs: list[Job]) -> set[str]:
    """Message ids of ``jobs`` still in Redis under a new id, their rows corrected.

    A delayed message that came due is enqueued in its queue under a new Redis
    id and its delay-queue copy acked; a paused queue's message is put back
    delayed under a new id. The ledger hears of the new id with a later batch,
    or (a paused queue's trip, the same attempt) not at all.
    """
    by_queue: dict[str, dict[str, Job]] = {}
    for job in jobs:
        by_queue.setdefault(job.queue_name, {})[job.message_id] = job
    found = set()
    for queue_name, rows in by_queue.items():
        for message_id, (place, redis_id) in queues.find(queue_name, set(rows)).items():
            job = rows[message_id]
            state, phase = (
                (states.ENQUEUED, PHASE_ENQUEUED)
                if place == "waiting"
                else (states.DELAYED, PHASE_DELAYED)
            )
            # The message's own events (same attempt, any later phase) still apply.
            _same(job).update(
                state=state, progress=with_phase(job.progress, phase), redis_message_id=redis_id
            )
            found.add(message_id)
    return found


_FIELDS = (
    "message_id",
    "actor_name",
    "queue_name",
    "options",
    "state",
    "enqueued_at",
    "started_at",
    "worker_host",
    "worker_pid",
    "attempts",
    "progress",
    "redis_message_id",
)
# How long after an ack the ledger may still be writing what the worker
# recorded before it: one flush interval, then the write itself.
WRITE_ALLOWANCE_S = 1.0
# Rows waiting in the ledger are checked against Redis oldest first, at most
# this many per run: a long backlog is legitimately waiting, and each check is a
# Redis round trip.
MAX_WAITING_CHECKS = 1000


def _settle_s() -> float:
    interval = jobs_settings.JOBS_LEDGER_FLUSH_MS / 1000
    return interval + WRITE_ALLOWANCE_S if interval > 0 else 0.0  # 0: written before the ack


def _stalled_running(now: datetime, grace: timedelta) -> Iterator[Job]:
    """ "running" rows whose worker is dead (or, when we cannot tell, outran its limit)."""
    candidates = Job.objects.filter(state=states.RUNNING, started_at__lt=now - grace)
    for job in candidates.only(*_FIELDS):
        assert job.started_at is not None
        alive = _worker_alive(job)
        limit = timedelta(milliseconds=_time_limit_ms(job))
        if alive is True or (alive is None and job.started_at > now - limit - grace):
            continue
        yield job


def _waiting(now: datetime, grace: timedelta) -> Iterator[Job]:
    """ "enqueued"/"delayed" rows old enough that a lost write could explain them."""
    candidates = Job.objects.filter(
        state__in=(states.ENQUEUED, states.DELAYED), enqueued_at__lt=now - grace
    ).order_by("enqueued_at")
    yield from candidates.only(*_FIELDS)[:MAX_WAITING_CHECKS]


def reconcile_stalled_jobs() -> list[Finding]:
    """Non-terminal ledger rows brought in line with Redis and the effects.

    "running" on a dead worker: requeued, failed or finished per the broker;
    "enqueued"/"delayed" whose message Redis no longer holds: failed or
    finished per the broker and the job's effects. A message gone from the
    Redis id the ledger knows is first looked for under any other id, once the
    ledger had a flush interval to catch up; an end that neither Redis nor a
    later event confirmed stays open to the message's own events (phase 0,
    ``_reconcile``). A worker on this host is
    known dead when its pid is gone, elsewhere when its presence key is; a row
    without a worker is presumed dead once it outran its time limit plus
    ``WATCHDOG_GRACE_S``.
    """
    # First sends the workers have not drained yet: a row is judged against
    # the latest Redis id the ledger can know.
    intake.catch_up()
    now = timezone.now()
    grace = timedelta(seconds=jobs_settings.JOBS_WATCHDOG_GRACE_S)
    findings = []
    gone = []
    for job in itertools.chain(_stalled_running(now, grace), _waiting(now, grace)):
        where = _where(job)
        if where == "gone":
            gone.append(job)
            continue
        findings += _finding(job, _reconcile(job, where))
    if gone:
        # The ledger may not have heard yet where the message went (a worker
        # acked its old Redis id after recording its new one in a batch still
        # on its way): give it a flush, then look for the rows that stayed put.
        time.sleep(_settle_s())
        stale = [job for job in gone if _same(job).exists()]
        found = _moved(stale)
        for job in stale:
            if job.message_id not in found:
                findings += _finding(job, _reconcile(job, "gone"))
    if findings:
        queues.force_maintenance()
    return findings


def _finding(job: Job, note: str | None) -> list[Finding]:
    if not note:
        return []
    return [Finding("stalled_job", job.message_id, {"actor": job.actor_name, "note": note})]


def stale_locks() -> list[Finding]:
    """Locks with no TTL (they would never expire) or held longer than the threshold.

    How long a lock has been held is read from its value (``held_since_ms``), not
    from its TTL: a holder that keeps renewing has a short TTL however long it has
    held the lock, and a fresh lock may have a long one.
    """
    client = get_redis_connection(jobs_settings.JOBS_CACHE)
    findings = []
    max_age_ms = jobs_settings.JOBS_WATCHDOG_LOCK_MAX_AGE_S * 1000
    seconds, micros = client.time()
    # Lock values carry their holder's wall clock; Redis's is the one clock every
    # host's watchdog sees alike. Hosts run NTP: skew is far below the threshold.
    now_ms = seconds * 1000 + micros // 1000
    for raw_key in client.scan_iter(match=f"{LOCK_PREFIX}*", count=500):
        key = raw_key.decode()
        if key.endswith(":fence"):
            continue
        ttl_ms = client.pttl(key)
        holder = client.get(key)
        if holder is None:
            continue  # released since the scan saw it
        text = holder.decode(errors="replace")
        # None for a key written by something other than redis_lock: its age is unknown.
        since_ms = held_since_ms(text)
        holder_text = text.rpartition("@")[0] if since_ms is not None else text
        if ttl_ms == -1:
            findings.append(Finding("lock_without_ttl", key, {"holder": holder_text}))
        elif since_ms is not None and now_ms - since_ms > max_age_ms:
            detail = {"holder": holder_text, "held_s": (now_ms - since_ms) // 1000}
            findings.append(Finding("lock_held_too_long", key, {**detail, "ttl_ms": ttl_ms}))
    return findings


def stuck_queues() -> list[Finding]:
    """Queues whose depth grew at every check for N minutes with no job finishing."""
    client = redis_broker().client
    minutes = jobs_settings.JOBS_WATCHDOG_QUEUE_STALL_MINUTES
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
    window = jobs_settings.JOBS_WATCHDOG_MAIL_EVERY_MINUTES * 60
    for kind, items in by_kind.items():
        if not client.set(MAILED_KEY.format(kind), "1", nx=True, ex=window):
            continue
        lines = [f"- {f.subject}: {json.dumps(f.detail, default=str)}" for f in items]
        try:
            mail_operators(
                f"Watchdog: {len(items)} {kind.replace('_', ' ')}",
                "\n".join(lines) + f"\n\nNo further mail about this for {window // 60} minutes.",
            )
        except Exception:
            # An alert mail that cannot go out must not stop the watchdog; the
            # findings are logged and in the metrics all the same.
            logger.warning("Watchdog: could not mail the operators about %s", kind, exc_info=True)
            continue
        sent += 1
    return sent


def run_watchdog() -> list[Finding]:
    findings = reconcile_stalled_jobs() + stale_locks() + stuck_queues()
    alert(findings)
    return findings
