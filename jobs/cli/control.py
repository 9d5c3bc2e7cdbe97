"""``jobs pause`` and ``jobs resume`` (the admin dashboard's queue buttons), and
``jobs unwind-fair``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from jobs.broker import queues, redis_broker
from jobs.cli import EXIT_USAGE
from jobs.concurrency import fairness
from jobs.conf import jobs_settings

PAUSE, RESUME = "pause", "resume"


def change_queues(verb: str, names: list[str]) -> dict[str, Any]:
    """Pause or resume ``names``; an unknown name is a usage error naming the known ones.

    Known are the queues this process's actors declare, and for ``resume`` also
    every paused name: a queue paused before its actors were removed (or whose
    actors this process does not import) must still be resumable.
    """
    paused = queues.controls().paused
    known = set(queues.queue_names()) | (paused if verb == RESUME else set())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise CommandError(
            f"unknown queue(s): {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}",
            returncode=EXIT_USAGE,
        )
    changed, unchanged = [], []
    for name in dict.fromkeys(names):
        if (name in paused) == (verb == PAUSE):
            unchanged.append(name)
            continue
        (queues.pause if verb == PAUSE else queues.resume)(name)
        changed.append(name)
    return {
        "action": verb,
        "queues": list(dict.fromkeys(names)),
        "changed": changed,
        "unchanged": unchanged,
    }


def unwind_queues(names: list[str], *, every: bool = False) -> dict[str, Any]:
    """Move each queue's fair jobs back into its list (``fairness.unwind``);
    ``every``: each queue with key lists in Redis, declared here or not."""
    broker = redis_broker()
    if not names and not every:
        raise CommandError("name the queues, or --all", returncode=EXIT_USAGE)
    known = set(queues.queue_names())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise CommandError(
            f"unknown queue(s): {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}",
            returncode=EXIT_USAGE,
        )
    if every:
        names = [*names, *fairness.fair_queues(broker.client, broker.namespace)]
    moved = {
        name: fairness.unwind(broker.client, broker.namespace, name)
        for name in dict.fromkeys(names)
    }
    return {"action": "unwind-fair", "queues": list(moved), "moved": moved}


def unwind_text(result: dict[str, Any]) -> str:
    if not result["moved"]:
        return "No fair key lists: nothing to move."
    return "\n".join(
        f"{name}: {count} job(s) moved back into the queue's list."
        for name, count in result["moved"].items()
    )


def change_text(result: dict[str, Any]) -> str:
    past = "Paused" if result["action"] == PAUSE else "Resumed"
    lines = []
    if result["changed"]:
        seconds = jobs_settings.JOBS_CONTROL_REFRESH_MS / 1000
        lines.append(
            f"{past}: {', '.join(result['changed'])} "
            f"(workers see it within {seconds:g} s, JOBS_CONTROL_REFRESH_MS)."
        )
    if result["unchanged"]:
        state = "paused" if result["action"] == PAUSE else "not paused"
        lines.append(f"Already {state}: {', '.join(result['unchanged'])}.")
    return "\n".join(lines)
