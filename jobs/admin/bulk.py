"""Act on every job that matches the job list's filters, as a job of its own.

The list's actions act on the rows an operator ticks; "all matching" may be a
million rows, which no web request should walk. So the admin shows the filter
and the count, asks, then sends ``jobs.tasks.bulk_action`` with the list's
query string and the highest matching id: the job rebuilds the same queryset
through the job admin's own ``ChangeList`` (so it means exactly what the page
showed, with the operator's permissions checked again when it runs), walks it
by primary key in batches and reports its progress, which its job page shows.
Jobs that arrive after the confirmation (ids above the ceiling) are left
alone, as is the bulk job itself.

Each batch is the same operation the list actions use (``retry_jobs``,
``cancel_jobs``, ``delete_jobs``), each idempotent per job, so a bulk job that
is retried or redelivered after a crash does the rest and nothing twice. It
can be cancelled from its page like any job: it stops at its next batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR, IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, SEARCH_VAR
from django.contrib.auth import get_user_model
from django.db.models import Max, QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.test import RequestFactory
from django.urls import reverse
from dramatiq.middleware import CurrentMessage

from jobs.errors import TransientJobError
from jobs.ledger import argument_search, audit, operations, states
from jobs.models import AuditEntry, Job
from jobs.runtime import progress

BATCH = 500
COUNT_LIMIT = 1_000_000  # beyond this the page says "more than"


@dataclass(frozen=True)
class BulkAction:
    name: str
    permission: str
    verb: str  # for sentences: "retry" -> "Retry N failed jobs"
    states: tuple[str, ...] | None  # the states it acts on; None: every job
    noun: str


ACTIONS = {
    "retry": BulkAction("retry", "jobs.retry_job", "Retry", (states.FAILED,), "failed job(s)"),
    "cancel": BulkAction(
        "cancel",
        "jobs.cancel_job",
        "Cancel",
        (states.ENQUEUED, states.DELAYED, states.RUNNING),
        "waiting or running job(s)",
    ),
    "delete": BulkAction("delete", "jobs.delete_job", "Delete", None, "job record(s)"),
}


def _filters(query: QueryDict) -> QueryDict:
    """The list's filters and search, without paging, sorting or popup parameters."""
    kept = query.copy()
    for name in ("p", "o", IS_POPUP_VAR, "_changelist_filters"):
        kept.pop(name, None)
    return kept


def matching(request: HttpRequest, action: BulkAction) -> QuerySet[Job]:
    """The jobs the job list shows for ``request`` (its filters and search) that
    ``action`` can act on. Raises ``IncorrectLookupParameters`` for filters the
    list refuses (a stale bookmark, a hand-edited URL)."""
    model_admin = admin.site.get_model_admin(Job)
    changelist = model_admin.get_changelist_instance(request)
    queryset: QuerySet[Job] = changelist.get_queryset(request)
    if action.states is not None:
        queryset = queryset.filter(state__in=action.states)
    return queryset.order_by()


def _count_text(count: int, *, searched: bool) -> str:
    if count > COUNT_LIMIT:
        return f"more than {COUNT_LIMIT:,}"
    if searched and count >= argument_search.MAX_IDS:
        # an argument search lists its newest MAX_IDS matches, no more
        return f"at least {count:,} (a search finds the newest {count:,}: narrow the filters)"
    return f"{count:,}"


def describe(query: QueryDict) -> str:
    return ", ".join(f"{k}={v}" for k, v in query.items()) or "no filter: every job"


def confirm_view(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the count and a confirmation; POST: send the bulk job, go to its page."""
    action = ACTIONS.get(name)
    if action is None:
        return HttpResponse("Unknown action.", status=404)
    model_admin = admin.site.get_model_admin(Job)
    if not (request.user.has_perm(action.permission) and model_admin.has_view_permission(request)):
        return HttpResponse(f"You may not {name} jobs.", status=403)
    query = _filters(request.GET)
    listing = RequestFactory().get(reverse("admin:jobs_job_changelist"), query)
    listing.user = request.user
    back = f"{reverse('admin:jobs_job_changelist')}?{query.urlencode()}"
    try:
        queryset = matching(listing, action)
    except IncorrectLookupParameters:
        return redirect(f"{reverse('admin:jobs_job_changelist')}?{ERROR_FLAG}=1")
    if request.method != "POST":
        count = queryset.values("pk")[: COUNT_LIMIT + 1].count()
        context = {
            **admin.site.each_context(request),
            "title": f"{action.verb} every matching job?",
            "action": action,
            "count": count,
            "count_text": _count_text(count, searched=bool(query.get(SEARCH_VAR))),
            "filters": describe(query),
            "back": back,
            "opts": Job._meta,
        }
        return TemplateResponse(request, "admin/jobs/job/bulk_confirm.html", context)
    ceiling = queryset.aggregate(top=Max("id"))["top"]
    if ceiling is None:
        messages.warning(request, f"No {action.noun} match these filters: nothing to do.")
        return redirect(back)
    from jobs.tasks import bulk_action  # the actor: the broker is set up by now

    who = audit.who_in(request)
    # Written first, counted "requested": the job fills in what it did.
    entry = audit.record(f"{name} (all matching)", who=who, target=describe(query), count=0)
    entry_id = entry.pk if entry is not None else 0
    message = bulk_action.send(name, query.urlencode(), who, ceiling, entry_id)
    if entry is not None:
        AuditEntry.objects.filter(pk=entry_id).update(
            note=f"requested: bulk job {message.message_id}"
        )
    messages.success(
        request,
        f"{action.verb} of every matching job started as a job of its own: "
        "this page shows its progress.",
    )
    listing_url = reverse("admin:jobs_job_changelist")
    return redirect(f"{listing_url}?{urlencode({'q': message.message_id})}")


def to_confirmation(request: HttpRequest, name: str) -> HttpResponse:
    """Django's "select all N" on a list action: the same confirmation as the bar's."""
    query = _filters(request.GET)
    return redirect(f"{reverse('admin:jobs_bulk', args=[name])}?{query.urlencode()}")


def run(name: str, query: str, username: str, ceiling: int, entry_id: int = 0) -> dict[str, Any]:
    """The bulk job's body: act on the matching jobs up to ``ceiling``, in batches,
    and write what it did into the audit entry ``entry_id``."""
    so_far: dict[str, Any] = {"done": 0, "ids": []}  # what a failure midway leaves done
    try:
        outcome = _run(name, query, username, ceiling, so_far)
    except Exception as exc:
        _settle(entry_id, so_far["done"], so_far["ids"], f"stopped: {exc}"[:200])
        raise
    _settle(entry_id, outcome["done"], outcome.pop("ids"), _summary(outcome))
    return outcome


def _summary(outcome: dict[str, Any]) -> str:
    return (
        f"done: {outcome['done']:,} of {outcome['matched']:,}, {outcome['left_alone']:,} left alone"
    )


def _settle(entry_id: int, count: int, ids: list[str], note: str) -> None:
    if entry_id:
        message = CurrentMessage.get_current_message()
        if message is not None:
            note = f"{note}; bulk job {message.message_id}"
        AuditEntry.objects.filter(pk=entry_id).update(
            count=count, message_ids=" ".join(ids[: audit.MAX_IDS]), note=note[:300]
        )


def _run(
    name: str, query: str, username: str, ceiling: int, so_far: dict[str, Any]
) -> dict[str, Any]:
    action = ACTIONS[name]
    user_model = get_user_model()
    user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
    if user is None or not user.is_active or not user.is_staff:
        raise PermissionError(f"{username} is no longer an active staff user")
    if not user.has_perm(action.permission):
        raise PermissionError(f"{username} may no longer {name} jobs")
    listing = RequestFactory().get(reverse("admin:jobs_job_changelist"), QueryDict(query))
    listing.user = user
    try:
        queryset = matching(listing, action).filter(id__lte=ceiling)
    except IncorrectLookupParameters as exc:
        raise PermissionError(f"the list refuses these filters: {exc}") from exc
    total = queryset.count()
    done = skipped = unreachable = last = 0
    ids: list[str] = so_far["ids"]
    seen = 0
    progress.report(0, total, f"{name}: starting")
    while batch := list(
        queryset.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:BATCH]
    ):
        last = batch[-1]
        chunk = Job.objects.filter(id__in=batch)
        if len(ids) < audit.MAX_IDS:
            ids.extend(chunk.values_list("message_id", flat=True)[: audit.MAX_IDS - len(ids)])
        if name == "retry":
            outcome = operations.retry_jobs(chunk)
        elif name == "cancel":
            outcome = operations.cancel_jobs(chunk, by=username)
        else:
            outcome = operations.delete_jobs(chunk)
        done += outcome.done + outcome.requested
        so_far["done"] = done
        skipped += outcome.skipped + outcome.already
        unreachable += outcome.unreachable
        seen += len(batch)
        progress.report(min(seen, total), total, f"{name}: {done:,} done, {skipped:,} left alone")
    if unreachable:
        # Those are still failed and unclaimed: the retry of this job does them
        # (and nothing twice: each retry is claimed on its row).
        raise TransientJobError(f"{unreachable:,} not retried: Redis did not answer")
    return {"action": name, "matched": total, "done": done, "left_alone": skipped, "ids": ids}
