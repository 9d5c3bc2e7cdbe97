"""The Concurrency limits page: each key template's declared limit and its
override, and overrides per key pattern (``tenant:big*``).

A change needs the permission ``jobs.pause_queue`` (the same flow control as
pausing a queue; without it the page is read-only), comes by POST (the admin
site checks its CSRF token) and is written to the audit trail. Every worker
follows it within about a second (``jobs.concurrency.limits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from jobs.concurrency import keys, limits
from jobs.consistency.reachability import UNREACHABLE, note_unreachable
from jobs.ledger.audit import record, who_in


@dataclass(frozen=True)
class TemplateRow:
    template: str
    actors: list[str]
    declared: int
    override: int | None


@dataclass(frozen=True)
class PatternRow:
    pattern: str
    limit: int


def can_change_limits(request: HttpRequest) -> bool:
    return request.user.has_perm("jobs.pause_queue")


def _rows(overrides: dict[str, int]) -> tuple[list[TemplateRow], list[PatternRow]]:
    by_template: dict[str, TemplateRow] = {}
    for actor_name, declaration in sorted(keys.declared().items()):
        row = by_template.get(declaration.template)
        if row is None:
            override = overrides.get(limits.TEMPLATE + declaration.template)
            row = TemplateRow(declaration.template, [], declaration.limit, override)
            by_template[declaration.template] = row
        row.actors.append(actor_name)
    patterns = [
        PatternRow(name[len(limits.PATTERN) :], limit)
        for name, limit in sorted(overrides.items())
        if name.startswith(limits.PATTERN)
    ]
    return list(by_template.values()), patterns


def limits_page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, error: str = ""
) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        return HttpResponse(status=403)
    unreachable = ""
    try:
        overrides = limits.read()
    except UNREACHABLE as exc:
        note_unreachable(exc)
        overrides, unreachable = {}, "Redis is unreachable: overrides are not shown."
    except (redis.RedisError, ValueError) as exc:  # a key of the wrong type or value
        overrides, unreachable = {}, f"Overrides could not be read ({type(exc).__name__})."
    templates, patterns = _rows(overrides)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Concurrency limits",
        "opts": model_admin.model._meta,
        "templates": templates,
        "patterns": patterns,
        "can_change": can_change_limits(request),
        "error": error,
        "unreachable": unreachable,
    }
    return TemplateResponse(request, "admin/jobs/limits.html", context)


def change_view(model_admin: admin.ModelAdmin[Any], request: HttpRequest) -> HttpResponse:
    """POST ``template`` or ``pattern``, and ``limit`` (empty: drop the override)."""
    if not can_change_limits(request):
        return HttpResponse("You may not change concurrency limits.", status=403)
    template = request.POST.get("template")
    try:
        if template is not None:
            if template not in {d.template for d in keys.declared().values()}:
                return HttpResponse("Unknown concurrency key template.", status=404)
            field_name, target = limits.TEMPLATE + template, template
        else:
            target = limits.parse_pattern(request.POST.get("pattern", ""))
            field_name = limits.PATTERN + target
        typed = request.POST.get("limit", "").strip()
        limit = limits.parse_limit(typed) if typed else None
    except limits.InvalidLimit as exc:
        return limits_page(model_admin, request, str(exc))
    before = limits.set_override(field_name, limit)
    if before != limit:  # recorded first: the override is in force from here
        was = "none" if before is None else str(before)
        now = "none (declared)" if limit is None else str(limit)
        record(
            "limit_reset" if limit is None else "limit_set",
            who=who_in(request),
            target=target,
            count=0,
            note=f"override {was} -> {now}",
        )
    said = "the declared limit" if limit is None else f"at most {limit} at once"
    messages.success(request, f"{target}: {said}; workers follow within a second.")
    try:
        limits.apply_to_parked()
    except redis.RedisError as exc:
        # Workers follow the override anyway (their next release or sweep).
        messages.warning(request, f"Waiting jobs not re-handed now ({type(exc).__name__}).")
    return redirect("admin:jobs_limits")
