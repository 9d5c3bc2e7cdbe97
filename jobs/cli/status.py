"""``jobs status``: queues, live workers, the ledger's counts, stale running jobs."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from django.db.models import Count

from jobs.broker import queues, workers
from jobs.cli.console import table, when
from jobs.ledger import states
from jobs.ledger.figures import failure_rate, state_counts
from jobs.models import Job

# "running" rows read to find stale ones: more than a fleet runs at once, and a
# bound on the command's cost when a crash left many behind.
RUNNING_SCAN = 5_000


def _all_time_counts() -> dict[str, int]:
    # Naming every state lets the database count ranges of jobs_job_state_id
    # instead of reading the table (as jobs.ledger.figures.state_counts does).
    rows = (
        Job.objects.filter(state__in=Job.State.values)
        .values("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = dict.fromkeys(Job.State.values, 0)
    counts.update({row["state"]: row["n"] for row in rows})
    return counts


def _worker(host: str, pid: int | None) -> str:
    """As ``jobs.broker.workers`` names a worker process: ``host:pid``."""
    return f"{host}:{pid}"


def status_report() -> dict[str, Any]:
    stats = queues.all_queue_stats()
    paused = sorted(queues.controls().paused)
    live = workers.live_workers()
    running = list(
        Job.objects.filter(state=states.RUNNING)
        .order_by("started_at")
        .values("id", "message_id", "actor_name", "worker_host", "worker_pid", "started_at")[
            :RUNNING_SCAN
        ]
    )
    per_worker = Counter(_worker(row["worker_host"], row["worker_pid"]) for row in running)
    # A "running" row whose worker has no presence key (it refreshes every 2 s,
    # expires after 30 s) ran on a process that is gone; the watchdog
    # reconciles such rows every minute.
    alive = set(live)
    stale = [row for row in running if _worker(row["worker_host"], row["worker_pid"]) not in alive]
    hour = state_counts(timedelta(hours=1))
    return {
        "queues": [
            {
                "name": s.name,
                "waiting": s.waiting,
                "delayed": s.delayed,
                "dead": s.dead,
                "oldest_waiting_age_s": (
                    None if s.oldest_waiting_age_s is None else round(s.oldest_waiting_age_s, 3)
                ),
                "paused": s.paused,
                "parked": s.parked,
            }
            for s in stats
        ],
        # Every paused name, declared here or not (a queue whose actors this
        # process does not import stays paused all the same).
        "paused": paused,
        "workers": [{"worker": w, "running": per_worker.get(w, 0)} for w in live],
        "ledger": {
            "all": _all_time_counts(),
            "last_hour": hour,
            "last_hour_failure_rate": failure_rate(hour),
        },
        "stale_running": [
            {
                "id": row["id"],
                "message_id": row["message_id"],
                "actor": row["actor_name"],
                "worker": _worker(row["worker_host"], row["worker_pid"]),
                "started_at": row["started_at"],
            }
            for row in stale
        ],
    }


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def status_text(report: dict[str, Any]) -> str:
    queue_rows = [
        (
            q["name"],
            q["waiting"],
            q["delayed"],
            q["dead"],
            _age(q["oldest_waiting_age_s"]),
            "paused" if q["paused"] else "",
        )
        for q in report["queues"]
    ]
    parts = [
        "Queues",
        table(("NAME", "WAITING", "DELAYED", "DEAD", "OLDEST", "PAUSED"), queue_rows),
    ]
    undeclared = sorted(set(report["paused"]) - {q["name"] for q in report["queues"]})
    if undeclared:
        parts.append(f"Also paused (no actor here declares them): {', '.join(undeclared)}")
    parts += ["", f"Workers: {len(report['workers'])} live"]
    if report["workers"]:
        worker_rows = [(w["worker"], w["running"]) for w in report["workers"]]
        parts.append(table(("WORKER", "RUNNING"), worker_rows))
    ledger = report["ledger"]
    rate = ledger["last_hour_failure_rate"]
    parts += [
        "",
        "Ledger",
        table(
            ("STATE", "ALL", "LAST HOUR"),
            [(state, ledger["all"][state], ledger["last_hour"][state]) for state in ledger["all"]],
        ),
        f"Failure rate, last hour: {'-' if rate is None else f'{rate:.0%}'}",
        "",
        f"Stale running jobs (worker gone): {len(report['stale_running'])}",
    ]
    if report["stale_running"]:
        rows = [
            (j["id"], j["message_id"], j["actor"], j["worker"], when(j["started_at"]))
            for j in report["stale_running"]
        ]
        parts.append(table(("ID", "MESSAGE ID", "ACTOR", "WORKER", "STARTED"), rows))
    return "\n".join(parts)
