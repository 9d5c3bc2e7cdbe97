"""The Schedules page and its buttons: edit the cron, enable, disable, reset, run now.

A change needs the permission ``jobs.run_periodic`` (without it the page is
read-only), comes by POST (the admin site checks its CSRF token) and is written
to the audit trail. Schedulers pick it up at their next minute
(``jobs.scheduling.overrides``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dramatiq
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from jobs.ledger.audit import record, who_in
from jobs.scheduling.listing import run_now, schedule_rows
from jobs.scheduling.overrides import InvalidCron, schedule_change, schedule_reset
from jobs.scheduling.scheduler import periodic_actors

VERBS = ("edit", "enable", "disable", "reset")


@dataclass(frozen=True)
class EditError:
    actor: str
    cron: str  # what was typed, shown again
    message: str


def can_change_schedules(request: HttpRequest) -> bool:
    return request.user.has_perm("jobs.run_periodic")


def schedules_page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, error: EditError | None = None
) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        return HttpResponse(status=403)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Schedules",
        "opts": model_admin.model._meta,
        "schedules": schedule_rows(),
        "can_run": can_change_schedules(request),
        "edit_error": error,
    }
    return TemplateResponse(request, "admin/jobs/schedules.html", context)


def _periodic_actor(actor_name: str) -> dramatiq.Actor[Any, Any] | None:
    return next((a for a in periodic_actors() if a.actor_name == actor_name), None)


def change_view(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, actor_name: str, verb: str
) -> HttpResponse:
    if not can_change_schedules(request):
        return HttpResponse("You may not change schedules.", status=403)
    actor = _periodic_actor(actor_name)
    if actor is None or verb not in VERBS:
        return HttpResponse("Unknown periodic job or action.", status=404)
    who = who_in(request)
    if verb == "reset":
        before = schedule_reset(actor=actor)
        was = "" if before.enabled else ", was disabled"
        note = f"cron {before.cron} -> {before.default}{was}"
        if before.overridden:  # nothing to reset otherwise: no entry
            record("schedule_reset", who=who, target=actor_name, note=note)
        done = f"{actor_name} follows the code's schedule again ({before.default})."
    elif verb == "edit":
        typed = request.POST.get("cron", "")
        try:
            before, after = schedule_change(actor=actor, who=who, cron_text=typed)
        except InvalidCron as exc:
            return schedules_page(model_admin, request, EditError(actor_name, typed, str(exc)))
        note = f"cron {before.cron} -> {after.cron}"
        if before.cron != after.cron:
            record("schedule_edit", who=who, target=actor_name, note=note)
        done = f"{actor_name}: {note}, from the next minute."
    else:
        before, after = schedule_change(actor=actor, who=who, enabled=verb == "enable")
        state = {True: "enabled", False: "disabled"}
        note = f"cron {after.cron}: {state[before.enabled]} -> {state[after.enabled]}"
        if before.enabled != after.enabled:
            record(f"schedule_{verb}", who=who, target=actor_name, note=note)
        done = f"{actor_name} {state[after.enabled]}, from the next minute."
    model_admin.message_user(request, done, messages.SUCCESS)
    return redirect("admin:jobs_schedules")


def run_now_view(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, actor_name: str
) -> HttpResponse:
    if not can_change_schedules(request):
        return HttpResponse("You may not run periodic jobs.", status=403)
    actor = _periodic_actor(actor_name)
    if actor is None:
        return HttpResponse("Unknown periodic job.", status=404)
    message = run_now(actor)
    if message is None:
        model_admin.message_user(
            request, f"{actor_name} was just started; not sent again.", messages.WARNING
        )
    else:
        record("run_now", who=who_in(request), target=actor_name, message_ids=[message.message_id])
        model_admin.message_user(
            request, f"{actor_name} enqueued ({message.message_id}).", messages.SUCCESS
        )
    return redirect("admin:jobs_schedules")
