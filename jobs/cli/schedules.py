"""``jobs schedules``: the periodic jobs as the scheduler follows them, and the
admin's schedule changes from a terminal (edit, enable, disable, reset)."""

from __future__ import annotations

from typing import Any

from jobs.cli.console import table, when
from jobs.cli.selection import SelectionError
from jobs.ledger import audit
from jobs.scheduling.listing import ScheduleRow, schedule_rows
from jobs.scheduling.overrides import InvalidCron, schedule_change, schedule_reset
from jobs.scheduling.scheduler import periodic_actors


def schedules_report() -> dict[str, Any]:
    return {"schedules": [_row(row) for row in schedule_rows()]}


def _row(row: ScheduleRow) -> dict[str, Any]:
    last = row.runs[0] if row.runs else None
    return {
        "actor": row.actor,
        "queue": row.queue,
        "cron": row.cron,
        "default": row.default,
        "overridden": row.overridden,
        "enabled": row.enabled,
        "next_run": row.next_run,
        "last_run": last.enqueued_at if last else None,
        "last_state": last.state if last else None,
    }


def schedules_text(report: dict[str, Any]) -> str:
    rows = [
        (
            s["actor"],
            s["queue"],
            s["cron"] + ("" if not s["overridden"] else f" (code: {s['default']})"),
            "on" if s["enabled"] else "OFF",
            when(s["next_run"]),
            f"{when(s['last_run'])} {s['last_state'] or ''}".strip(),
        )
        for s in report["schedules"]
    ]
    if not rows:
        return "No periodic jobs."
    return table(("actor", "queue", "cron", "on", "next run", "last run"), rows)


def change_schedule(actor_name: str, verb: str, cron_text: str | None, who: str) -> dict[str, Any]:
    """Edit, enable, disable or reset ``actor_name``'s schedule, as the admin does."""
    actors = {a.actor_name: a for a in periodic_actors()}
    actor = actors.get(actor_name)
    if actor is None:
        known = ", ".join(sorted(actors)) or "none"
        raise SelectionError(f"no periodic job named {actor_name!r} (known: {known})")
    if verb == "reset":
        before = schedule_reset(actor=actor)
        changed = before.overridden
        after_cron, after_enabled = before.default, True
    else:
        try:
            before, after = schedule_change(
                actor=actor,
                who=who,
                cron_text=cron_text if verb == "edit" else None,
                enabled=None if verb == "edit" else verb == "enable",
            )
        except InvalidCron as exc:
            raise SelectionError(str(exc)) from exc
        changed = (before.cron, before.enabled) != (after.cron, after.enabled)
        after_cron, after_enabled = after.cron, after.enabled
    note = f"cron {before.cron} -> {after_cron}" + (
        "" if before.enabled == after_enabled else f", {'on' if after_enabled else 'off'}"
    )
    if changed:
        audit.record(f"schedule_{verb}", who=who, source="cli", target=actor_name, note=note)
    return {
        "actor": actor_name,
        "changed": changed,
        "cron": after_cron,
        "enabled": after_enabled,
        "note": note,
    }


def change_text(result: dict[str, Any]) -> str:
    if not result["changed"]:
        switch = "on" if result["enabled"] else "off"
        return f"{result['actor']}: unchanged ({result['cron']}, {switch})."
    return f"{result['actor']}: {result['note']}, from the schedulers' next minute."
